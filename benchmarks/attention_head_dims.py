"""Attention's achieved rate across head dimensions, timed as the profiler times its grid (kernels.time_attention:
the runtime's SDPA path, forward and backward, median of repeats). Which head dimensions run at the rate of the
next one up (padded), which in between: the planner reads an unmeasured head dimension at the nearest measured
one's rate, and `plan profile --model M --base P` measures the model's own.

    python benchmarks/attention_head_dims.py --out DIR [--head-dims 64,80,96,112,128,160,192,256] [--seqs 1024,4096,16384]
      [--at-power-cap]

Writes DIR/attention_head_dims.csv (one row a case) and DIR/provenance.json (machine, date, commit:
runtime/profiler/environment.py), and prints the rows.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import torch

    from device_results import write_device_results
    from runtime.profiler import kernels, shapes
    from runtime.profiler.build import ATTENTION_REPS
    from runtime.profiler.timing import at_power_cap

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--head-dims", default="64,80,96,112,128,160,192,256")
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--at-power-cap", action="store_true", help="time with the GPU held at its power cap")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_head_dims: needs a CUDA GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    dims = [int(x) for x in args.head_dims.split(",")]
    seqs = [int(x) for x in args.seqs.split(",")]
    rows = []
    with at_power_cap(device, args.at_power_cap):
        for causal in (True, False):
            for p in shapes.attention_grid("cuda", False, dims, None, (causal,)):
                if p["seq"] not in seqs:
                    continue
                r = kernels.time_attention(**p, device=device, **ATTENTION_REPS["cuda"])
                rows.append({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})
    write_device_results(args.out, "attention_head_dims", rows, device, at_power_cap=args.at_power_cap)
    for r in rows:
        print(f"causal={r['causal']!s:5} seq={r['seq']:6} d={r['head_dim']:3}: fwd {r['fwd_tflops']:6.1f} "
              f"bwd {r['bwd_tflops']:6.1f} TFLOP/s ({r['fwd_s'] * 1e3:.3f} / {r['bwd_s'] * 1e3:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
