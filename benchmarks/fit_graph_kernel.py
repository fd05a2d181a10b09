"""Fit a profile's per-kernel GPU time for steps replayed as CUDA graphs (Profile.graph_kernel_s) on measured runs.

An eagerly issued kernel costs the host's launch (the profile's kernel_launch_s, about 7.5 us on the H200 machines,
and 5 us beside every GEMM); replayed from a CUDA graph it costs only its start and drain on the GPU. Pricing graphed
steps with the eager terms over-predicts models of many small kernels (BERT-large at micro-batch 4: 7-15%). This
script re-predicts the graphed rows of `plan validate` results (each from its exact plan, the CSV's .plans.jsonl
sidecar) with graph_kernel_s on a grid, keeps the value of least median absolute step-time error over the rows of
the fitted models, reports the held-out models' rows apart, and with --write stores the value in the profile with a
record in provenance.calibrations.

    python benchmarks/fit_graph_kernel.py benchmarks/results/graph-kernel-fit/runs.csv \\
        --profile profiles/h200-sxm-calibrated.json --holdout-models bert-large,moe-small [--write]
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.validation_report import load  # noqa: E402
from planner.cluster import ClusterSpec  # noqa: E402
from planner.cost import evaluate  # noqa: E402
from planner.profile import Profile  # noqa: E402
from planner.provenance import commit_label  # noqa: E402

GRID_US = [x / 4 for x in range(0, 41)]  # 0 to 10 us in steps of 0.25 us


def errors(rows, prof: Profile, gap_s: float | None) -> list[float]:
    p = dataclasses.replace(prof, graph_kernel_s=gap_s)
    return [evaluate(plan, ClusterSpec.from_dict(plan.cluster), p).step_s / meas - 1 for plan, meas, _ in rows]


def summary(errs: list[float]) -> str:
    if not errs:
        return "no rows"
    a = [abs(e) for e in errs]
    return f"median |err| {statistics.median(a):.1%}, worst {max(a):.1%}, signed median {statistics.median(errs):+.1%} (n={len(a)})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, nargs="+", help="plan validate results (each with its .plans.jsonl sidecar)")
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--holdout-models", default="", help="models whose rows are reported, never fitted")
    ap.add_argument("--write", action="store_true", help="store the fitted value in --profile")
    args = ap.parse_args(argv)
    held = {m for m in args.holdout_models.split(",") if m}
    prof = Profile.load(args.profile)
    fit, hold = [], []
    for path in args.csv:
        df, plans = load(path)
        for (_, r), plan in zip(df.iterrows(), plans):
            if not plan.layout.cuda_graph:
                continue
            (hold if r["model"] in held else fit).append((plan, float(r["measured_step_s"]), r["model"]))
    if not fit:
        print("error: no graphed rows of fitted models", file=sys.stderr)
        return 1
    best = min(GRID_US, key=lambda g: statistics.median(abs(e) for e in errors(fit, prof, g * 1e-6)))
    gap_s = best * 1e-6
    before_fit, before_hold = errors(fit, prof, None), errors(hold, prof, None)  # the eager terms
    after_fit, after_hold = errors(fit, prof, gap_s), errors(hold, prof, gap_s)
    print(f"graph_kernel_s = {best:g} us (grid {GRID_US[0]:g}-{GRID_US[-1]:g} us)")
    print(f"fitted rows   before: {summary(before_fit)}\n              after:  {summary(after_fit)}")
    print(f"held-out rows before: {summary(before_hold)}\n              after:  {summary(after_hold)}")
    for (plan, meas, model), e0, e1 in zip(fit + hold, before_fit + before_hold, after_fit + after_hold):
        tag = "held" if model in held else "fit "
        print(f"  {tag} {model:<22} mb{plan.layout.micro_batch:<3} {meas:.4f} s measured  {e0:+.1%} -> {e1:+.1%}")
    if args.write:
        d = json.loads(args.profile.read_text())
        d["graph_kernel_s"] = gap_s
        d["provenance"].setdefault("calibrations", []).append({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "tool": "benchmarks/fit_graph_kernel.py " + " ".join(str(a) for a in (argv if argv is not None else sys.argv[1:])),
            "commit": commit_label(),
            "what": f"graph_kernel_s = {best:g} us: fixed GPU time per kernel of a step replayed as a CUDA graph",
            "results": [str(p) for p in args.csv],
            "fitted_rows": len(fit), "held_out_rows": len(hold), "held_out_models": sorted(held),
            "fitted_before": summary(before_fit), "fitted_after": summary(after_fit),
            "held_out_before": summary(before_hold), "held_out_after": summary(after_hold)})
        indent = 1 if args.profile.read_text().startswith('{\n "') else 2
        args.profile.write_text(json.dumps(d, indent=indent) + "\n")
        print(f"wrote graph_kernel_s into {args.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
