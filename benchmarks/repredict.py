"""Re-predict `plan validate` results with several profiles: step-time and memory error of each row under each.

    python benchmarks/repredict.py RESULTS.csv --profile h200-sxm-calibrated --profile OTHER.json [--out FILE.csv]

Each row is re-predicted from its exact plan (the CSV's `.plans.jsonl` sidecar) with planner.cost.evaluate, as
benchmarks/validation_report.py does; the table says how far each profile's prediction is from the measurement.
Used to compare the shipped profile with the same profile after `plan profile --model ... --base`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.validation_report import load  # noqa: E402
from planner.cluster import ClusterSpec  # noqa: E402
from planner.cost import evaluate  # noqa: E402
from planner.profile import Profile, resolve_profile_path  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--profile", action="append", required=True, help="profile file or shipped name (repeat)")
    ap.add_argument("--out", type=Path, help="write the per-row table here")
    args = ap.parse_args(argv)
    df, plans = load(args.csv)
    table = df[["model", "micro_batch", "recompute", "measured_step_s", "measured_mem_gib"]].copy()
    for i, name in enumerate(args.profile):
        prof = Profile.load(resolve_profile_path(name))
        preds = [evaluate(p, ClusterSpec.from_dict(p.cluster), prof) for p in plans]
        table[f"step_err_{i}"] = [pr.step_s / m - 1 for pr, m in zip(preds, df["measured_step_s"])]
        table[f"mem_err_{i}"] = [max(pr.memory_gib_per_rank) / m - 1 for pr, m in zip(preds, df["measured_mem_gib"])]
        err = table[f"step_err_{i}"].abs()
        print(f"profile {i}: {name}: step time median |error| {err.median():.1%}, worst {err.max():.1%} (n={len(err)})")
    print(table.to_string(index=False, float_format=lambda x: f"{x:+.4f}" if abs(x) < 1 else f"{x:.4f}"))
    if args.out:
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
