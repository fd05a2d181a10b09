"""FP8 grouped GEMMs against FP8 dense ones, beside the same for bf16: does an FP8 grouped GEMM keep the bf16 grouped
GEMM's time over the dense GEMM of all its rows? The planner assumes so where a target runs its MoE experts in FP8
(planner/cost/targets.py RuntimeTarget.fp8_experts; Profile.grouped_gemm_s with table 'fp8'), having measured only the
bf16 ratio (runtime/profiler/grouped.py). This measures both on the device, in torch's own kernels:

    bf16   torch._grouped_mm(x, w^T, offs)          against F.linear(x, w as one [n, k] matrix)
    fp8    torch._scaled_grouped_mm (row-wise scales) against torch._scaled_mm (row-wise scales)

forward only ([experts x rows, k] x [k, n] per expert), at the expert shapes of the published MoE rows (DeepSeek-V3
at EP 64: 4 local experts of 2 x 2048 by 7168 and back; Qwen3-235B at EP 16: 8 of 2 x 1536 by 4096 and back) and
512-8192 rows per expert. Each case is timed as the profiler times a GEMM (runtime/profiler/timing.time_fn); a kernel
torch does not offer on this GPU is recorded with its error and skipped. Writes DIR/fp8_grouped_gemm.csv and
DIR/provenance.json and prints the rows.

    python benchmarks/fp8_grouped_gemm.py --out DIR [--at-power-cap]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = (  # (local experts, n, k): the up- (gate and up) and down-projection of each row's experts
    (4, 2 * 2048, 7168), (4, 7168, 2048),   # DeepSeek-V3, EP 64
    (8, 2 * 1536, 4096), (8, 4096, 1536),   # Qwen3-235B-A22B, EP 16
)
ROWS = (512, 2048, 8192)
FP8 = "float8_e4m3fn"


def _cases(torch, experts: int, rows: int, n: int, k: int, device):
    """{name: fn(i)} of the four kernels for one shape, inputs made once."""
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(experts * rows, k, device=device, dtype=torch.bfloat16, generator=g)
    w = torch.randn(experts, n, k, device=device, dtype=torch.bfloat16, generator=g) / k ** 0.5
    offs = torch.arange(rows, experts * rows + 1, rows, device=device, dtype=torch.int32)
    w2d = w.reshape(experts * n, k)[:n]  # one [n, k] weight: the dense GEMM of all the rows
    f8 = getattr(torch, FP8)
    x8, w8 = x.to(f8), w.to(f8)
    w8_2d = w8.reshape(experts * n, k)[:n]
    sx = torch.ones(experts * rows, device=device, dtype=torch.float32)
    sw = torch.ones(experts, n, device=device, dtype=torch.float32)
    return {
        "bf16_grouped": lambda i: torch._grouped_mm(x, w.transpose(1, 2), offs=offs),
        "bf16_dense": lambda i: F.linear(x, w2d),
        "fp8_grouped": lambda i: torch._scaled_grouped_mm(x8, w8.transpose(1, 2), sx, sw, offs=offs,
                                                          out_dtype=torch.bfloat16),
        "fp8_dense": lambda i: torch._scaled_mm(x8, w8_2d.t(), scale_a=sx[:, None], scale_b=sw[0][None, :],
                                                out_dtype=torch.bfloat16),
    }


def measure(args) -> int:
    import torch

    from device_results import write_device_results
    from runtime.profiler.timing import at_power_cap, time_fn

    if not torch.cuda.is_available():
        print("fp8_grouped_gemm: needs a CUDA GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    rows_out, errors = [], {}
    with at_power_cap(device, args.at_power_cap):
        for experts, n, k in SHAPES:
            for rows in ROWS:
                row = {"experts": experts, "rows_per_expert": rows, "n": n, "k": k}
                for name, fn in _cases(torch, experts, rows, n, k, device).items():
                    try:
                        fn(0)
                        torch.cuda.synchronize(device)
                        row[f"{name}_s"] = round(time_fn(fn, device, warmup=3, repeats=10).median_s, 9)
                    except Exception as exc:  # a kernel this torch or GPU lacks: recorded, the rest measured
                        errors.setdefault(name, f"{type(exc).__name__}: {str(exc)[:300]}")
                        row[f"{name}_s"] = ""
                for kind in ("bf16", "fp8"):
                    g, d = row[f"{kind}_grouped_s"], row[f"{kind}_dense_s"]
                    row[f"{kind}_grouped_over_dense"] = round(g / d, 4) if g and d else ""
                rows_out.append(row)
                print(", ".join(f"{key} {v}" for key, v in row.items()), flush=True)
    write_device_results(args.out, "fp8_grouped_gemm", rows_out, device, at_power_cap=args.at_power_cap,
                         errors=errors, command="python benchmarks/fp8_grouped_gemm.py " + " ".join(sys.argv[1:]))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--at-power-cap", action="store_true", help="time with the GPU held at its power cap")
    return measure(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
