"""Sweep tile / pipeline choices of the grouped weight-gradient kernel (runtime/grouped_wgrad.py) and a block-pointer
variant, at the EP bar's shapes; prints one JSON line per (variant, config, shape)."""
import json, sys
import torch, triton, triton.language as tl
sys.path.insert(0, ".")
from runtime import grouped_wgrad as gw
from runtime.profiler.timing import time_fn

@triton.jit
def _bp_kernel(dy_ptr, x_ptr, offs_ptr, out_ptr, N, K, ACCUMULATE: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    g = tl.program_id(1)
    tiles_k = tl.cdiv(K, BLOCK_K)
    pn = tl.program_id(0) // tiles_k
    pk = tl.program_id(0) % tiles_k
    start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0)
    end = tl.load(offs_ptr + g)
    a_ptr = tl.make_block_ptr(dy_ptr, shape=(end, N), strides=(N, 1), offsets=(start, pn * BLOCK_N),
                              block_shape=(BLOCK_R, BLOCK_N), order=(1, 0))
    b_ptr = tl.make_block_ptr(x_ptr, shape=(end, K), strides=(K, 1), offsets=(start, pk * BLOCK_K),
                              block_shape=(BLOCK_R, BLOCK_K), order=(1, 0))
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for _ in range(0, tl.cdiv(end - start, BLOCK_R)):
        a = tl.load(a_ptr, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_ptr, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(tl.trans(a), b, acc)
        a_ptr = tl.advance(a_ptr, (BLOCK_R, 0))
        b_ptr = tl.advance(b_ptr, (BLOCK_R, 0))
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pk * BLOCK_K + tl.arange(0, BLOCK_K)
    omask = (rn < N)[:, None] & (rk < K)[None, :]
    out = out_ptr + g.to(tl.int64) * N * K + rn[:, None].to(tl.int64) * K + rk[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=omask, other=0.0)
    tl.store(out, acc, mask=omask)

dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
counts = torch.multinomial(torch.ones(8), 16384, replacement=True, generator=g).bincount(minlength=8)
offs = counts.cumsum(0).to(torch.int32).to(dev)
cfgs = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
        (256, 128, 64, 8, 4), (128, 256, 32, 8, 4), (128, 256, 32, 8, 5), (256, 128, 32, 8, 4), (128, 128, 128, 8, 3),
        (256, 256, 32, 8, 3), (128, 256, 64, 4, 3)]
for n, k in ((5632, 2048), (2048, 2816)):
    dy = torch.randn(16384, n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16384, k, device=dev, dtype=torch.bfloat16)
    mg = torch.zeros(8, n, k, device=dev, dtype=torch.float32)
    ref = torch.zeros_like(mg)
    ref.add_(torch._grouped_mm(dy.t(), x, offs=offs))
    gemm = time_fn(lambda i: torch._grouped_mm(dy.t(), x, offs=offs), dev, warmup=3, repeats=15).median_s
    print(json.dumps(dict(variant="torch_grouped_mm", n=n, k=k, s=gemm, tflops=2 * 16384 * n * k / gemm / 1e12)), flush=True)
    for variant, kern in (("pointers", gw._grouped_wgrad_kernel), ("block_ptr", _bp_kernel)):
        for bn, bk, br, w, st in cfgs:
            grid = (triton.cdiv(n, bn) * triton.cdiv(k, bk), 8)
            try:
                f = lambda i: kern[grid](dy, x, offs, mg, n, k, ACCUMULATE=False, BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br,
                                         num_warps=w, num_stages=st)
                f(0)
                err = ((mg - ref).abs().max() / ref.abs().max()).item()
                t = time_fn(f, dev, warmup=3, repeats=15).median_s
                print(json.dumps(dict(variant=variant, n=n, k=k, cfg=[bn, bk, br, w, st], s=t,
                                      tflops=2 * 16384 * n * k / t / 1e12, rel_err=err)), flush=True)
            except Exception as exc:  # noqa: BLE001
                print(json.dumps(dict(variant=variant, n=n, k=k, cfg=[bn, bk, br, w, st], error=repr(exc)[:200])), flush=True)
