"""FP8 quantisation and GEMM times on one GPU: the eager quantisation against the fused one (device time per
call, CUDA events over back-to-back calls), and a layer-sized GEMM in bf16 against FP8 with each quantisation.

    python benchmarks/fp8_quantize.py --out results.json
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from runtime.parallel import fp8


def device_ms(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "commit": os.environ.get("PLAN_COMMIT", "unknown")}
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    res["quantize_8192x8192_ms"] = {
        "eager": device_ms(lambda: fp8.quantize_eager(x, fp8.E4M3)),
        "fused": device_ms(lambda: fp8.quantize(x, fp8.E4M3)),
        "eager_transposed": device_ms(lambda: fp8.quantize_eager(x.t().contiguous(), fp8.E4M3)),
        "fused_transposed": device_ms(lambda: fp8.quantize(x, fp8.E4M3, transpose=True)),
    }
    q1, _ = fp8.quantize_eager(x, fp8.E4M3)
    q2, _ = fp8.quantize(x, fp8.E4M3)
    res["fused_equals_eager"] = bool(torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)))
    # a GPT-1.3B MLP up-projection at micro-batch 4 x 2048 tokens: [8192, 2048] x [2048, 8192]
    t, h, f = 8192, 2048, 8192
    xa = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
    w = torch.randn(f, h, device=dev, dtype=torch.bfloat16) * 0.02
    flops = 2 * t * h * f
    bf16 = device_ms(lambda: torch.nn.functional.linear(xa, w))
    linear = device_ms(lambda: fp8.linear(xa, w, None))
    xq, sx = fp8.quantize(xa, fp8.E4M3)
    wq, sw = fp8.quantize(w, fp8.E4M3)
    gemm_only = device_ms(lambda: torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16))
    res["gemm_8192x2048x8192"] = {"bf16_ms": bf16, "fp8_linear_with_quantisation_ms": linear,
                                  "fp8_gemm_only_ms": gemm_only,
                                  "bf16_tflops": flops / bf16 / 1e9, "fp8_gemm_only_tflops": flops / gemm_only / 1e9}
    print(json.dumps(res, indent=1))
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
