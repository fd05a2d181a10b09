"""Ring attention's block kernels on one GPU: exactness against fp32 math, and speed, per backend.

    python benchmarks/ring_attention_kernels.py --out FILE.json

For each backend the ring can use on CUDA (cudnn, flash), the script checks one block's forward (out and
natural-log lse) and backward (dq, dk, dv given the final out and lse) against runtime.parallel.context's
fp32 math kernels, for causal and non-causal blocks, sq != sk and GQA; then a two-block merge (keys split
in halves, merged by log-sum-exp, backward per half with the merged out and lse, as the ring does) against
one full block. Then it times forward + backward of the blocks a CP2 rank runs at 32k (8k-token chunks,
Llama-style 16 heads of 128, 4 KV heads) per backend, and F.scaled_dot_product_attention's own path on the
full 32k sequence for reference. Writes one JSON file; prints it too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.parallel import context as ctxmod  # noqa: E402


def _force(backend: str):
    """Make attention_block_* use one backend: cudnn, flash or math."""
    ctxmod._cudnn_state["usable"] = None if backend == "cudnn" else False
    ctxmod._use_flash_orig = getattr(ctxmod, "_use_flash_orig", ctxmod._use_flash)
    if backend == "math":
        ctxmod._use_flash = lambda q: False
    else:
        ctxmod._use_flash = ctxmod._use_flash_orig


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _block(backend, q, k, v, dout, causal, scale):
    _force(backend)
    out, lse, meta = ctxmod.attention_block_forward(q, k, v, causal, scale)
    dq, dk, dv = ctxmod.attention_block_backward(dout, q, k, v, out, lse, causal, scale, meta)
    return out, lse, dq, dk, dv


def check(backend: str) -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for (b, h, kvh, sq, sk, d, causal) in [(2, 8, 8, 512, 512, 128, True), (2, 8, 2, 512, 1024, 128, False),
                                          (1, 16, 4, 1024, 512, 64, False), (1, 4, 4, 256, 256, 128, False)]:
        q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, kvh, sk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, kvh, sk, d, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
        scale = d ** -0.5
        ref = _block("math", q, k, v, dout, causal, scale)
        try:
            got = _block(backend, q, k, v, dout, causal, scale)
        except Exception as err:  # reported, not raised: the point is to learn what runs
            rows.append({"backend": backend, "shape": [b, h, kvh, sq, sk, d, causal], "error": repr(err)[:300]})
            continue
        rows.append({"backend": backend, "shape": [b, h, kvh, sq, sk, d, causal],
                     "fallback": ctxmod._cudnn_state["usable"] is False and backend == "cudnn",
                     **{f"rel_{n}": _rel(g, r) for n, g, r in zip(("out", "lse", "dq", "dk", "dv"), got, ref)}})
    # two-block merge, as the ring does it
    b, h, kvh, s, d = 1, 8, 2, 1024, 128
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, kvh, 2 * s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, kvh, 2 * s, d, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    scale = d ** -0.5
    ref = _block("math", q, k, v, dout, False, scale)
    _force(backend)
    out = torch.zeros(b, h, s, d, device="cuda")
    lse = torch.full((b, h, s), float("-inf"), device="cuda")
    metas = []
    halves = [(k[:, :, :s].contiguous(), v[:, :, :s].contiguous()), (k[:, :, s:].contiguous(), v[:, :, s:].contiguous())]
    for kk, vv in halves:
        o, l, meta = ctxmod.attention_block_forward(q, kk, vv, False, scale)
        ctxmod._merge(out, lse, o, l)
        metas.append(meta)
    out_b = out.to(torch.bfloat16)
    dq = torch.zeros_like(q, dtype=torch.float32)
    dks, dvs = [], []
    for (kk, vv), meta in zip(halves, metas):
        gq, gk, gv = ctxmod.attention_block_backward(dout, q, kk, vv, out_b, lse, False, scale, meta)
        dq += gq
        dks.append(gk)
        dvs.append(gv)
    rows.append({"backend": backend, "shape": "two-block merge", "rel_out": _rel(out, ref[0]), "rel_lse": _rel(lse, ref[1]),
                 "rel_dq": _rel(dq, ref[2]), "rel_dk": _rel(torch.cat(dks, 2), ref[3]),
                 "rel_dv": _rel(torch.cat(dvs, 2), ref[4])})
    return rows


def _time_ms(fn, iters=10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def speed(backend: str) -> dict:
    """fwd+bwd of a CP2 rank's blocks at 32k: one 16k causal diagonal block, one 16k x 8k full block."""
    h, kvh, d, c = 16, 4, 128, 8192
    q = torch.randn(1, h, 2 * c, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, kvh, 2 * c, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, kvh, 2 * c, d, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    kh, vh = k[:, :, :c].contiguous(), v[:, :, :c].contiguous()
    scale = d ** -0.5
    _force(backend)

    def rank_blocks():
        _block(backend, q, k, v, dout, True, scale)
        _block(backend, q, kh, vh, dout, False, scale)
    ms = _time_ms(rank_blocks)
    # useful FLOPs: causal 2c x 2c is half of (2c)^2, the other block c x 2c; 4*d per (q,k) pair fwd, 2.5x fwd+bwd
    pairs = (2 * c) ** 2 / 2 + (2 * c) * c
    return {"backend": backend, "cp2_rank_blocks_fwd_bwd_ms": ms,
            "tflops": 3.5 * 4 * d * h * pairs / (ms * 1e-3) / 1e12,
            "fell_back": ctxmod._cudnn_state["usable"] is False and backend == "cudnn"}


def sdpa_reference() -> dict:
    import torch.nn.functional as F
    h, d, s = 16, 128, 32768
    q = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16)

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    ms = _time_ms(step)
    return {"backend": "F.sdpa full 32k causal (one GPU)", "fwd_bwd_ms": ms, "half_ms": ms / 2,
            "tflops": 3.5 * 4 * d * h * s * s / 2 / (ms * 1e-3) / 1e12}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "checks": [], "speed": []}
    for backend in ("cudnn", "flash"):
        res["checks"] += check(backend)
    for backend in ("cudnn", "flash"):
        try:
            res["speed"].append(speed(backend))
        except Exception as err:
            res["speed"].append({"backend": backend, "error": repr(err)[:300]})
    res["speed"].append(sdpa_reference())
    text = json.dumps(res, indent=1)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
