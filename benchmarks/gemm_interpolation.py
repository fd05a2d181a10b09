"""Leave-one-out accuracy of the planner's GEMM interpolation on a profile's measured GEMM grid.

For a sample of the measured shapes, each is removed from the table, predicted from the rest with the
planner's own lookup (planner.profile._GemmTable / _gemm_s_cached, the table time without the profile's fixed per-kernel term, so
device time is compared with device time), and compared with its measured time. No GPU is needed: the
measurements are the profile's.

    python benchmarks/gemm_interpolation.py --profile profiles/h200-sxm.json --out benchmarks/results/gemm-interpolation
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.profile import _GemmTable, _gemm_s_cached  # noqa: E402
from planner.provenance import git_commit  # noqa: E402



def leave_one_out(points: list, copy_bw: float, sample: list[int]) -> list[dict]:
    rows = []
    for i in sample:
        rest = tuple(p for j, p in enumerate(points) if j != i)
        m, n, k, t = points[i]
        pred = _gemm_s_cached(_GemmTable(rest, copy_bw), int(m), int(n), int(k))
        rows.append({"m": int(m), "n": int(n), "k": int(k), "measured_s": t, "predicted_s": pred,
                     "error": pred / t - 1})
    return rows


def summary(rows: list[dict], min_s: float) -> str:
    a = sorted(abs(r["error"]) for r in rows if r["measured_s"] >= min_s)
    return (f"GEMMs >= {min_s * 1e6:g} us: n={len(a)}, median |error| {100 * statistics.median(a):.1f}%, "
            f"90th percentile {100 * a[int(0.9 * len(a))]:.1f}%, worst {100 * a[-1]:.1f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="profiles/h200-sxm.json")
    ap.add_argument("--out", required=True, help="folder for loo.csv and provenance.json")
    ap.add_argument("--force", action="store_true", help="replace the result already in --out (git keeps the old one)")
    ap.add_argument("--sample", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--table", choices=("points", "wgrad_points"), default="points",
                    help="the profile's bf16-output GEMMs, or its weight-gradient GEMMs (fp32 accumulation)")
    args = ap.parse_args()
    out = Path(args.out)
    if (out / "loo.csv").exists() and not args.force:
        print(f"error: {out} already holds a result; pass --force to replace it", file=sys.stderr)
        return 1
    prof = json.loads(Path(args.profile).read_text())
    points = [tuple(p) for p in prof["gemm"].get(args.table, [])]
    if len(points) < 2:
        print(f"error: {args.profile} has no '{args.table}' GEMM table to test", file=sys.stderr)
        return 1
    sample = random.Random(args.seed).sample(range(len(points)), min(args.sample, len(points)))
    rows = leave_one_out(points, prof["copy_bandwidth_bytes_per_s"], sample)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "loo.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"leave-one-out over {len(rows)} of {len(points)} measured GEMMs ({args.table}) of {args.profile} "
             f"(seed {args.seed}), interpolation at commit {git_commit(short=True)['git_commit']}"]
    lines += [summary(rows, s) for s in (0.0, 20e-6, 100e-6)]
    import datetime
    import os
    (out / "provenance.json").write_text(json.dumps({
        "benchmark": "leave-one-out of the planner's GEMM interpolation over a profile's measured GEMMs (no GPU)",
        "command": "python benchmarks/gemm_interpolation.py " + " ".join(sys.argv[1:]),
        "commit": git_commit(short=True)["git_commit"],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, no GPU (the measurements are the profile's)", "gpu": None,
        "result": lines}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
