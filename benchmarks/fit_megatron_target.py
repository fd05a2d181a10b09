"""Fit the free factors of the `megatron` prediction target (planner/cost/targets.py) on the `fit` rows of
benchmarks/published/runs.csv, and only on them.

Command that writes profiles/targets/megatron.json:
    PYTHONPATH=$PWD python benchmarks/fit_megatron_target.py --force

Each fit row is planned pinned to its published layout (benchmarks/published_rows.py) for the target; with the
layouts and stage splits held, the factors are fitted by robust least squares (soft L1, SCALE) on the log of
predicted over published tokens/s/GPU (coordinate descent over a fine grid per factor, repeated until nothing moves); the rows are then
planned again with the fitted factors (the pinned search may choose another micro-batch or recompute split) and the
factors refitted, until the layouts stop changing (at most ROUNDS times). Rows whose GPU kind has no profile on this
tree are skipped and listed in the file. Holdout rows are never read: the loader takes the fit split only and
fit_factors refuses any other row.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(REPO / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from published_rows import load_rows, plan_row, repredict, tokens_per_s_per_gpu  # noqa: E402

from planner.cost.targets import (MEGATRON_DP_BUCKET_PARAMS, MEGATRON_FACTORS, MEGATRON_HOST_LAYER_S,  # noqa: E402
                                  RuntimeTarget, megatron_target, target_file)
from planner.errors import PlanError  # noqa: E402
from planner.provenance import commit_label, cpu_model  # noqa: E402

CODE_PATHS = ("planner", "profiles", "benchmarks/published", "benchmarks/published_rows.py",
              "benchmarks/published_check.py", "benchmarks/fit_megatron_target.py")
"""What the figures depend on: a commit label is marked dirty only for changes here (not for the results folder)."""

FREE_FACTORS = {
    "compute_factor": (0.5, 1.5),
    "dp_overlap_contention": (0.0, 1.0),
    "ep_hidden_fraction": (0.0, 1.0),
    "fp8_gemm_factor": (0.5, 1.5),
    "expert_factor": (0.5, 2.0),
    "legacy_compute_factor": (0.5, 1.5),
}
"""Each free factor and the range it is fitted in."""
assert tuple(FREE_FACTORS) == MEGATRON_FACTORS

START = {"compute_factor": 1.0, "dp_overlap_contention": 0.2, "ep_hidden_fraction": 0.5, "fp8_gemm_factor": 1.0,
         "expert_factor": 1.0, "legacy_compute_factor": 1.0}
"""Where the fit starts. EP starts above 0: a plan decides its EP overlap (Layout.overlap_ep) by whether it pays, and
at 0 it pays nothing, so the first layouts would leave it off and the fraction could not be fitted."""
SCALE = 0.1
"""The robust loss's scale on log errors: rows within about 10% count as squares, rows further off grow linearly
(soft L1), so that a row the model cannot express (an attention kind, a dispatcher) does not drag the others."""
PRIOR_WEIGHT = 0.1
"""Weight of the prior on log(kernel factor)^2 (KERNEL_FACTORS): a factor 10% off 1.0 costs about what ten rows 10%
off cost (the soft-L1 term of a row 10% off is about 0.004). Today's Megatron-Core rows are nearly all FP8, so the
bf16 kernel factor and the FP8 GEMM factor trade against each other, and the prior holds their trade-off away from
the ends of the ranges; the MoE factor rests on three rows and the legacy factor on one source, and the prior keeps
them at 1.0 where the rows cannot tell."""
KERNEL_FACTORS = ("compute_factor", "fp8_gemm_factor", "expert_factor", "legacy_compute_factor")
"""The factors that scale kernel time (the others are hidden fractions and the host's)."""
GRID_STEPS = 21
LEVELS = 2
ROUNDS = 3


def target_of(factors: dict) -> RuntimeTarget:
    return megatron_target(factors)


def log_errors(planned, factors: dict, play: bool = False) -> list[float]:
    """log(predicted / published) of each (row, plan, profile, play ratio) with the plan's layout and stages held.
    Inside the fit (play=False) the pipeline is timed by the schedule's closed form times the row's ratio of the
    played step to it at the round's start (playing a 64-stage schedule of 512 micro-batches takes 0.1 s, the closed
    form microseconds); the figures written are played."""
    t = target_of(factors)
    out = []
    for row, plan, prof, ratio in planned:
        p = repredict(row, plan, t, prof, play=play)
        out.append(math.log(tokens_per_s_per_gpu(row, p) / (1.0 if play else ratio) / row.tokens_per_s_per_gpu))
    return out


def loss(planned, factors: dict) -> float:
    """Soft-L1 (robust least squares) over the rows' log errors, plus a weak prior holding the kernel factors
    (KERNEL_FACTORS) at our kernels' rates (1.0) where the rows cannot tell them apart (PRIOR_WEIGHT)."""
    prior = PRIOR_WEIGHT * sum(math.log(factors[k]) ** 2 for k in KERNEL_FACTORS)
    return prior + sum(2 * SCALE * SCALE * (math.sqrt(1 + (e / SCALE) ** 2) - 1) for e in log_errors(planned, factors))


def fit_factors(planned, start: dict) -> dict:
    """Least-squares factors for the planned fit rows (coordinate descent over a grid per factor)."""
    if any(row.split != "fit" for row, *_ in planned):
        raise ValueError("fit_factors takes rows of the 'fit' split only")
    f = dict(start)
    best = loss(planned, f)
    widths = {name: hi - lo for name, (lo, hi) in FREE_FACTORS.items()}
    for _ in range(LEVELS):  # each level a grid of GRID_STEPS around the current point, a fifth as wide as the last
        for _ in range(20):
            moved = False
            for name, (lo, hi) in FREE_FACTORS.items():
                a = max(lo, f[name] - widths[name] / 2)
                b = min(hi, f[name] + widths[name] / 2)
                for i in range(GRID_STEPS):
                    trial = {**f, name: a + (b - a) * i / (GRID_STEPS - 1)}
                    v = loss(planned, trial)
                    if v < best - 1e-12:
                        best, f, moved = v, trial, True
            if not moved:
                break
        widths = {k: w / 5 for k, w in widths.items()}
    return f


def plan_fit_rows(rows, factors: dict, profiles: dict):
    planned, failed = [], {}
    t = target_of(factors)
    for row in rows:
        prof = profiles[row.cluster.gpu]
        try:
            plan = plan_row(row, t, profile=prof)
            ratio = repredict(row, plan, t, prof, play=True).step_s / repredict(row, plan, t, prof, play=False).step_s
            planned.append((row, plan, prof, ratio))
        except PlanError as exc:
            failed[row.row_id] = str(exc)
    return planned, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default=str(target_file("megatron")))
    ap.add_argument("--force", action="store_true", help="overwrite the output file")
    args = ap.parse_args(argv)
    out = Path(args.output)
    if out.exists() and not args.force:
        print(f"fit_megatron_target: '{out}' exists; pass --force to overwrite it", file=sys.stderr)
        return 1
    rows = load_rows(split="fit")
    assert all(r.split == "fit" for r in rows)
    usable = [r for r in rows if not r.skip_reason]
    skipped = {r.row_id: r.skip_reason for r in rows if r.skip_reason}
    profiles = {r.cluster.gpu: r.profile() for r in usable}
    factors, layouts = dict(START), None
    for rnd in range(ROUNDS):
        planned, failed = plan_fit_rows(usable, factors, profiles)
        now = [(row.row_id, plan.layout, [s.__dict__ for s in plan.stages]) for row, plan, *_ in planned]
        if now == layouts:
            break
        layouts = now
        factors = fit_factors(planned, factors)
        print(f"round {rnd + 1}: {', '.join(f'{k} {v:.3f}' for k, v in factors.items())}; "
              f"median abs error {sorted(abs(math.exp(e) - 1) for e in log_errors(planned, factors))[len(planned) // 2]:.3f}", flush=True)
    planned, failed = plan_fit_rows(usable, factors, profiles)  # the rows as the fitted target plans them
    errs = log_errors(planned, factors, play=True)
    data = {
        "format": "parallel-plan/runtime-target",
        "version": 1,
        "runtime": "megatron",
        "factors": {k: round(v, 4) for k, v in factors.items()},
        "dp_bucket_params": MEGATRON_DP_BUCKET_PARAMS,
        "host_layer_s": MEGATRON_HOST_LAYER_S,
        "provenance": {
            "fitted_on": f"{len(planned)} fit rows of benchmarks/published/runs.csv",
            "command": "PYTHONPATH=$PWD python benchmarks/fit_megatron_target.py --force",
            "commit": commit_label(dirty_paths=CODE_PATHS, mark_dirty=True),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node() or 'unknown'} ({cpu_model() or 'unknown CPU'})",
            "method": "robust least squares (soft L1, scale 0.1) on log(predicted / published tokens/s/GPU) with a weak "
                      "prior (weight 0.1) of the kernel factors at 1.0, pinned published layouts, "
                      "coordinate descent over a grid per factor, layouts re-planned with the fitted factors",
            "factor_ranges": FREE_FACTORS,
            "rows": {row.row_id: round(math.exp(e) - 1, 4) for (row, *_), e in zip(planned, errs)},
            "rows_failed": failed,
            "rows_skipped": skipped,
            "stated": {"host_layer_s": "planner/cost/targets.py MEGATRON_HOST_LAYER_S (an estimate)",
                       "tp_hidden_fraction": "planner/cost/targets.py MEGATRON_TP_HIDDEN_FRACTION",
                       "dp_bucket_params": "Megatron-Core's default DDP bucket (max(40M, 1M x DP) parameters)"},
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{k} {v}" for k, v in data["factors"].items()))
    for rid, e in data["provenance"]["rows"].items():
        print(f"  {rid:14s} {e:+.1%}")
    for rid, why in {**failed, **skipped}.items():
        print(f"  {rid:14s} not used: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
