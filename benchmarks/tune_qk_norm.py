"""Time runtime/qk_norm.py's backward (one GPU) over its block, programs-per-SM and warp choices at Qwen3-8B's
per-rank shape (4096 tokens, 32 q and 8 kv heads of 128, bf16): median of 50 CUDA-event timings after warm-up,
each choice checked against the first for equal gradients; the whole grid is timed twice (pass 0, 1) to show the
noise between passes. Prints a CSV.

    python benchmarks/tune_qk_norm.py > tune.csv
"""
import itertools
import statistics
import sys

import torch

from runtime import qk_norm as qn


def main() -> int:
    tokens, heads, kv, d = 4096, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(tokens, 1, (heads + 2 * kv) * d, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(qkv.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    wq = torch.nn.Parameter(torch.ones(d, device="cuda", dtype=torch.bfloat16))
    wk = torch.nn.Parameter(torch.ones(d, device="cuda", dtype=torch.bfloat16))
    first = None
    print("pass,rows_per_block,programs_per_sm,warps,backward_us,max_abs_diff")
    for pass_, rows, per_sm, warps in itertools.product((0, 1), (16, 32, 64, 128), (4, 8, 16), (4, 8)):
        qn.BWD_ROWS_PER_BLOCK, qn.BWD_PROGRAMS_PER_SM, qn.BWD_WARPS = rows, per_sm, warps
        x = qkv.detach().requires_grad_(True)
        y = qn.qk_norm(x, wq, wk, heads, kv, 1e-6)
        times = []
        for i in range(60):
            x.grad = wq.grad = wk.grad = None
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            y.backward(dy, retain_graph=True)
            b.record()
            torch.cuda.synchronize()
            if i >= 10:
                times.append(a.elapsed_time(b) * 1e3)
        grads = torch.cat([x.grad.flatten().float(), wq.grad.float(), wk.grad.float()])
        first = grads if first is None else first
        diff = (grads - first).abs().max().item()
        print(f"{pass_},{rows},{per_sm},{warps},{statistics.median(times):.1f},{diff:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
