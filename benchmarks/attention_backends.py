"""SDPA's attention kernels side by side: cuDNN's fused attention (what torch picks on Hopper today, and what the
profiles measure) against torch's flash-attention kernel (FlashAttention-2, what torch 2.5.1-2.8 picked on H100 by
default and what PyTorch's context parallel ran until 2025), forward and backward, causal and not, at the sequence
lengths training runs use. The planner prices a runtime that ran FA2 at the measured time ratio
(planner/cost/targets.py, RuntimeTarget.attention_fa2; profiles/targets/attention-fa2.json, written from this file by
`--write-target`).

    python benchmarks/attention_backends.py --out DIR [--seqs 1024,...,32768] [--head-dim 128] [--at-power-cap]
    python benchmarks/attention_backends.py --write-target DIR/attention_backends.csv

Each case is timed as the profiler times attention (runtime/profiler/kernels.time_attention: median of repeats, inputs
rotated), with SDPA held to one backend; batch x sequence is 16k tokens (32k: batch 1), 16 heads of 128 as in the
FlashAttention-3 paper's figures (arXiv 2407.08608, Figures 5-6), whose H100 numbers are the cross-check. Writes
DIR/attention_backends.csv and DIR/provenance.json and prints the rows.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET_FILE = ROOT / "profiles" / "targets" / "attention-fa2.json"
BACKENDS = ("cudnn", "flash")


def measure(args) -> int:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from device_results import write_device_results
    from runtime.profiler import kernels
    from runtime.profiler.build import ATTENTION_REPS
    from runtime.profiler.timing import at_power_cap

    if not torch.cuda.is_available():
        print("attention_backends: needs a CUDA GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    rows = []
    with at_power_cap(device, args.at_power_cap):
        for causal in (True, False):
            for seq in (int(x) for x in args.seqs.split(",")):
                for backend in BACKENDS:
                    with sdpa_kernel([which[backend]]):
                        r = kernels.time_attention(max(1, 16384 // seq), 16, seq, args.head_dim, causal, device,
                                                   **ATTENTION_REPS["cuda"])
                    r["backend"] = backend
                    rows.append({k: (round(v, 7) if isinstance(v, float) else v) for k, v in r.items()})
                    print(f"{backend:5} causal={causal!s:5} seq={seq:6}: fwd {r['fwd_tflops']:6.1f} "
                          f"bwd {r['bwd_tflops']:6.1f} TFLOP/s", flush=True)
    write_device_results(args.out, "attention_backends", rows, device, at_power_cap=args.at_power_cap,
                         command="python benchmarks/attention_backends.py " + " ".join(sys.argv[1:]))
    return 0


def fa2_ratios(csv_path: Path) -> dict:
    """FA2's time over cuDNN's per direction, median over the measured sequence lengths and masks."""
    rows = list(csv.DictReader(open(csv_path)))
    by = {(r["backend"], r["causal"], r["seq"]): r for r in rows}
    out = {}
    for d in ("fwd", "bwd"):
        ratios = [float(by[("flash", c, s)][f"{d}_s"]) / float(by[("cudnn", c, s)][f"{d}_s"])
                  for (b, c, s) in by if b == "cudnn" and ("flash", c, s) in by]
        out[d] = round(statistics.median(ratios), 3)
        out[f"{d}_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def write_target(csv_path: Path) -> int:
    prov_path = csv_path.parent / "provenance.json"
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    ratios = fa2_ratios(csv_path)
    source = str(csv_path.relative_to(ROOT)) if csv_path.is_relative_to(ROOT) else str(csv_path)
    doc = {"fa2_over_runtime_fwd": ratios["fwd"], "fa2_over_runtime_bwd": ratios["bwd"],
           "provenance": {"what": "time of torch's flash-attention kernel (FlashAttention-2) over the runtime's SDPA "
                                  "kernel (cuDNN fused attention), median over causal and non-causal cases at the "
                                  "measured sequence lengths, head dimension 128; ranges "
                                  f"fwd {ratios['fwd_range']}, bwd {ratios['bwd_range']}",
                          "measured": {k: prov.get(k) for k in ("gpu_name", "hostname", "date", "git_commit", "torch",
                                                                 "cuda", "cudnn", "at_power_cap", "command") if k in prov},
                          "from": source,
                          "written_by": f"python benchmarks/attention_backends.py --write-target {source}"}}
    if TARGET_FILE.exists() and json.loads(TARGET_FILE.read_text()) == doc:
        print(f"{TARGET_FILE.relative_to(ROOT)} unchanged")
        return 0
    TARGET_FILE.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {TARGET_FILE.relative_to(ROOT)}: fwd x{ratios['fwd']}, bwd x{ratios['bwd']}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--at-power-cap", action="store_true", help="time with the GPU held at its power cap")
    ap.add_argument("--write-target", type=Path, metavar="CSV",
                    help="write profiles/targets/attention-fa2.json from a measured CSV instead of measuring")
    args = ap.parse_args(argv)
    if args.write_target:
        return write_target(args.write_target.resolve())
    if args.out is None:
        ap.error("--out is required when measuring")
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
