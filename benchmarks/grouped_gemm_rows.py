"""Time torch._grouped_mm (the runtime's expert GEMMs, runtime/parallel/expert_mlp.py) over G experts of M rows
each against one dense GEMM of G*M rows and against G separate GEMMs of M rows, on the GPU it runs on.

    python benchmarks/grouped_gemm_rows.py [--out FILE.json]

Shapes: Qwen3-30B-A3B's experts (hidden 2048, moe_intermediate 768: fc1 [2048 -> 1536], fc2 [768 -> 2048]),
forward layout, bf16. Prints one line per (G, M, n, k) and writes them as JSON."""
import argparse
import json
import sys

import torch


def _time_s(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("grouped_gemm_rows: needs a CUDA GPU.", file=sys.stderr)
        return 2
    rows = []
    for n, k in ((1536, 2048), (2048, 768)):
        for g, m in ((128, 256), (64, 512), (32, 1024), (16, 2048), (8, 4096), (128, 64), (16, 512), (4, 8192)):
            x = torch.randn(g * m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
            offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * m
            wt = w.transpose(1, 2)
            grouped = _time_s(lambda: torch._grouped_mm(x, wt, offs=offs))
            w0 = w[0].t()
            dense = _time_s(lambda: x @ w0)
            xs = x[:m]
            single = _time_s(lambda: xs @ w0)
            flops = 2 * g * m * n * k
            row = dict(experts=g, rows_per_expert=m, n=n, k=k, grouped_s=grouped, dense_same_rows_s=dense,
                       one_small_gemm_s=single, grouped_tflops=flops / grouped / 1e12,
                       dense_tflops=flops / dense / 1e12, grouped_over_dense=grouped / dense,
                       grouped_over_experts_x_small=grouped / (g * single))
            rows.append(row)
            print(f"G={g:4d} M={m:5d} n={n} k={k}: grouped {grouped*1e6:8.1f} us ({row['grouped_tflops']:.0f} TF/s), "
                  f"dense {dense*1e6:8.1f} us ({row['dense_tflops']:.0f}), G x small {g*single*1e6:8.1f} us, "
                  f"grouped/dense {row['grouped_over_dense']:.2f}")
    if a.out:
        with open(a.out, "x") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
