"""`plan calibrate RESULTS.csv --profile IN -o OUT`: refit a profile's overlap fractions and efficiency factors
from measured runs.

The measured kernel and collective times stay as they are; what calibration changes are the numbers in the
profile that are a stated model rather than a measurement: `overlap_hidden_fraction` per dimension (tp, dp,
pp, cp, ep), the share of a dimension's communication that overlapped compute hides, and `efficiency`, the
multipliers on the cost model's terms (compute, expert, tp, ..., host, ring: planner.profile.EFFICIENCY_TERMS)
that absorb what the runtime spends beyond its measured kernels. `--terms` picks which factors are fitted,
`--no-efficiency` fits the overlap fractions alone.

Every row must have been measured on the profile's GPU (the CSV's `gpu` column, mapped by
planner.profile.gpu_kind_of_device); a file with rows of another GPU is refused, not filtered (see
check_rows_gpu).

Runs are split at random (seeded) into calibration and held-out runs, plan by plan: repeat runs of one plan
(same model, layout, micro-batch, recompute, batch and sequence) stay on one side, so no held-out plan was
seen by the fit. `--holdout-models` holds out every run of the models named instead. Each fraction that
changes any calibration run's prediction is searched on a grid (coordinate descent, then a finer grid around
the best), then each efficiency factor the same way, minimising the median absolute relative error of the
predicted step time; ties go to the smaller mean error, then to the value nearest the original. The output
profile's provenance records what changed, from which rows (1-based data-row numbers of the CSV), and the
accuracy before and after on both the calibration and the held-out rows; the report printed is the held-out
accuracy, which calibration never saw.

Each row is re-predicted from its exact plan: `plan validate --append FILE` also appends the plan to
FILE's sidecar `<FILE stem>.plans.jsonl` (row number -> plan JSON), since the CSV's fixed columns do not
carry the sharding level, overlap switches or the model's full shape. A row without a sidecar entry is
rebuilt from its columns when that is unambiguous (a catalogue model or a config under --models, and
dp * cp == 1 so the sharding level is moot); otherwise it is skipped, and the report says so.

No torch import: this is planner code.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from planner.errors import PlanError
from planner.results_file import (DIMS, MEASURED_RANGES, RESULT_COLUMNS, _float,  # noqa: F401 (re-exported)
                                   check_measured_ranges, parse_recompute_text, read_results, read_sidecar,
                                   recompute_text, sidecar_path)


@dataclass
class Run:
    row: int
    label: str
    plan: object  # planner.plan.Plan
    cluster: object  # planner.cluster.ClusterSpec
    measured_step_s: float


def rows_to_runs(rows: list[dict], sidecar: dict[int, dict], profile_gpu: str, model_dirs: list[Path]
                 ) -> tuple[list[Run], list[str]]:
    """(runs that can be re-predicted, one note per row that cannot)."""
    from planner.cluster import ClusterSpec
    from planner.legality import check_plan
    from planner.model import resolve_model
    from planner.plan import Layout, Plan, TrainingShape

    runs, skipped = [], []
    for r in rows:
        n = r["_row"]
        measured = _float(r.get("measured_step_s"))
        if measured is None or measured <= 0:
            skipped.append(f"row {n}: no measured step time")
            continue
        label = f"{r['model']} TP{r['tp']} PP{r['pp']}x{r['vpp']} DP{r['dp']} CP{r['cp']} EP{r['ep']} " \
                f"mb{r['micro_batch']} {r['recompute']}"
        try:
            if n in sidecar:
                plan = Plan.from_dict(sidecar[n], f"the plan of row {n} in the sidecar")
                cluster = ClusterSpec.from_dict(plan.cluster)
            else:
                ints = {k: int(r[k]) for k in ("gpus", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch",
                                                 "global_batch", "seq_len")}
                if ints["dp"] * ints["cp"] > 1:
                    skipped.append(f"row {n}: no plan in the sidecar and dp*cp > 1 (its sharding level is unknown)")
                    continue
                model = _resolve(r["model"], model_dirs, resolve_model)
                if model is None:
                    skipped.append(f"row {n}: no plan in the sidecar and model '{r['model']}' is not in the "
                                   "catalogue or under --models")
                    continue
                lay = Layout(tp=ints["tp"], pp=ints["pp"], vpp=ints["vpp"], dp=1, cp=1, ep=ints["ep"],
                             micro_batch=ints["micro_batch"], sharding="none")
                gpn = min(ints["gpus"], 8)
                cluster = ClusterSpec(gpu=profile_gpu, num_gpus=ints["gpus"], gpus_per_node=gpn)
                plan = Plan(model=model, cluster=cluster.to_dict(),
                            training=TrainingShape(seq_len=ints["seq_len"], global_batch=ints["global_batch"]),
                            layout=lay, stages=parse_recompute_text(r["recompute"]))
                check_plan(plan)
        except (PlanError, ValueError, KeyError) as exc:
            skipped.append(f"row {n}: {exc}")
            continue
        runs.append(Run(n, label, plan, cluster, measured))
    return runs, skipped


def _resolve(name: str, model_dirs: list[Path], resolve_model):
    try:
        return resolve_model(name)
    except PlanError:
        pass
    for d in model_dirs:
        for p in (Path(d) / name / "config.json", Path(d) / f"{name}.json"):
            if p.exists():
                return resolve_model(str(p))
    return None


# -- fitting ------------------------------------------------------------------------------------------------
def with_overlap(profile, fractions: dict, efficiency: dict | None = None):
    """A copy of the profile with other overlap fractions (and efficiency factors); shares the GEMM lookup
    table (and its cache)."""
    new = replace(profile, overlap_hidden_fraction=dict(fractions),
                  efficiency=dict(profile.efficiency if efficiency is None else efficiency))
    new.__dict__["_gk"] = profile._gemm_key()
    return new


EFFICIENCY_GRID = [round(2 ** (i / 8), 4) for i in range(-16, 33)]
"""Candidate factors, 0.25x to 16x in steps of 2^(1/8) (9%): wide enough for the pipeline hop's factor, which the
GPU refit puts near 8x (benchmarks/results/calibration/)."""
EFFICIENCY_FINE = [2 ** (j / 64) for j in range(-8, 9)]
"""And around each factor's current value, steps of 2^(1/64) (1.1%) up to one coarse step either side: the compute factor
is a few percent off 1, where the coarse grid has only 0.917, 1 and 1.09 (benchmarks/results/calibration/)."""


def sensitive_terms(runs: list[Run], profile) -> list[str]:
    """Efficiency terms whose factor changes at least one run's prediction."""
    from planner.profile import EFFICIENCY_TERMS

    base = predict_all(runs, profile)
    out = []
    for term in EFFICIENCY_TERMS:
        eff = {**profile.efficiency, term: 2.0 * profile.eff(term)}
        if any(abs(a - b) > 1e-9 * max(a, 1e-30) for a, b in zip(base, predict_all(runs, with_overlap(
                profile, profile.overlap_hidden_fraction, eff)))):
            out.append(term)
    return out


def efficiency_candidates(current: float) -> list[float]:
    """The values one descent step tries for a factor: the coarse grid and the fine steps around its current
    value together, so a dominant term a few percent off 1 (compute) moves in the same pass as a small term that
    could otherwise absorb the common bias with a large, unphysical factor: a descent over the coarse grid alone
    first leaves compute at 1 on the H100 runs of benchmarks/results/validation-h100/ and takes the optimizer's
    factor to 0.28."""
    return sorted(set(EFFICIENCY_GRID) | {round(current * f, 4) for f in EFFICIENCY_FINE})


def fit_efficiency(runs: list[Run], profile, terms: list[str], passes: int = 8) -> dict:
    """Coordinate descent of the efficiency factors, each step over efficiency_candidates, minimising the median
    absolute relative step-time error (ties: smaller mean error, then the factor nearest 1)."""
    cur = {t: profile.eff(t) for t in terms}
    cur = {**profile.efficiency, **cur}

    def best_over(t, values):
        scored = []
        for v in values:
            med, mean = _objective(runs, with_overlap(profile, profile.overlap_hidden_fraction, {**cur, t: v}))
            scored.append((round(med, 12), round(mean, 12), abs(math.log(v)), v))
        return min(scored)[3]

    for _ in range(passes):
        changed = False
        for t in terms:
            v = best_over(t, efficiency_candidates(cur.get(t, 1.0)))
            if v != cur.get(t, 1.0):
                cur[t], changed = v, True
        if not changed:
            break
    return {k: v for k, v in cur.items() if abs(v - 1.0) > 1e-12}


def predict_all(runs: list[Run], profile) -> list[float]:
    from planner.cost import evaluate

    return [evaluate(r.plan, r.cluster, profile, "ours").step_s for r in runs]  # measured runs are of our runtime


def errors(runs: list[Run], profile) -> list[float]:
    """Relative step-time errors (predicted - measured) / measured."""
    return [(p - r.measured_step_s) / r.measured_step_s for p, r in zip(predict_all(runs, profile), runs)]


def accuracy(runs: list[Run], profile) -> dict:
    if not runs:
        return {"n": 0}
    e = errors(runs, profile)
    a = [abs(x) for x in e]
    return {"n": len(runs), "median_abs_rel_error": statistics.median(a), "worst_abs_rel_error": max(a),
            "mean_abs_rel_error": sum(a) / len(a), "median_signed_rel_error": statistics.median(e)}


def _objective(runs, profile) -> tuple[float, float]:
    a = [abs(x) for x in errors(runs, profile)]
    return statistics.median(a), sum(a) / len(a)


def sensitive_dims(runs: list[Run], profile) -> list[str]:
    """Dimensions whose fraction changes at least one run's prediction (the others cannot be fitted)."""
    out = []
    base = dict(profile.overlap_hidden_fraction)
    for d in DIMS:
        lo = predict_all(runs, with_overlap(profile, {**base, d: 0.0}))
        hi = predict_all(runs, with_overlap(profile, {**base, d: 1.0}))
        if any(abs(a - b) > 1e-12 * max(abs(a), 1e-30) for a, b in zip(lo, hi)):
            out.append(d)
    return out


def fit_overlap(runs: list[Run], profile, dims: list[str], step: float = 0.05, passes: int = 6) -> dict:
    """Coordinate descent on a grid over [0, 1] (then a grid of step/10 around the best), minimising the
    median absolute relative step-time error; returns the fitted fractions (all dimensions)."""
    cur = {d: float(profile.overlap_hidden_fraction.get(d, 0.0)) for d in DIMS}
    cur.update({k: float(v) for k, v in profile.overlap_hidden_fraction.items()})
    orig = dict(cur)
    grid = [round(i * step, 6) for i in range(int(round(1 / step)) + 1)]

    def best_over(d, values):
        scored = []
        for v in values:
            med, mean = _objective(runs, with_overlap(profile, {**cur, d: v}))
            scored.append((round(med, 12), round(mean, 12), abs(v - orig[d]), v))
        return min(scored)[3]

    for _ in range(passes):
        changed = False
        for d in dims:
            v = best_over(d, grid)
            if v != cur[d]:
                cur[d], changed = v, True
        if not changed:
            break
    fine = step / 10
    for d in dims:
        vals = sorted({min(1.0, max(0.0, round(cur[d] + i * fine, 6))) for i in range(-9, 10)})
        cur[d] = best_over(d, vals)
    return cur


def plan_key(run: Run) -> str:
    """What makes two runs repeats of one plan: model, layout (micro-batch, sharding, overlap switches...),
    batch and sequence, and per-stage recompute; not the prediction or the provenance."""
    d = run.plan.to_dict()
    return json.dumps([run.plan.model.name, d["layout"], d["training"], d["stages"]], sort_keys=True)


def split_rows(runs: list[Run], holdout_fraction: float, seed: int) -> tuple[list[Run], list[Run]]:
    """(calibration runs, held-out runs): whole plans drawn at random (seeded) until about holdout_fraction of
    the runs are held out, at least one plan on each side. Whole plans, not rows: a plan measured twice with
    one repeat on each side would let the fit see the held-out plan and flatter the held-out accuracy."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(plan_key(r), []).append(r)
    plans = list(groups.values())
    if len(plans) < 2:
        raise PlanError(f"all {len(runs)} usable runs repeat one plan; held-out accuracy needs runs of at least "
                        "two different plans")
    random.Random(seed).shuffle(plans)
    target = max(1, int(round(len(runs) * holdout_fraction)))
    hold: list[Run] = []
    for g in plans[:-1]:  # the last plan drawn always calibrates
        if len(hold) >= target:
            break
        hold += g
    held = {r.row for r in hold}
    cal = [r for r in runs if r.row not in held]
    return sorted(cal, key=lambda r: r.row), sorted(hold, key=lambda r: r.row)


def check_rows_gpu(rows: list[dict], profile_gpu: str, results: Path, profile_name: str) -> None:
    """Refuses a results file with rows measured on another GPU than the profile's (or on an unnamed one).
    Refused rather than skipped: such rows mean the wrong file or the wrong profile (CPU rows calibrated into
    a GPU profile would fit factors such as pp x22.6 into it), and a silent skip would shrink the fit unnoticed; a file
    that mixes GPUs on purpose is split by its `gpu` column first."""
    from planner.profile import gpu_kind_of_device

    other = [r for r in rows if not (r.get("gpu") or "").strip() or gpu_kind_of_device(r["gpu"]) != profile_gpu]
    if other:
        first = other[0]
        device = first.get("gpu") or "an unnamed device"
        raise PlanError(f"'{results}' has {len(other)} row(s) measured on another GPU than profile '{profile_name}' "
                        f"({profile_gpu}), the first row {first['_row']} on '{device}'; calibrate each GPU's rows "
                        "against a profile of that GPU")


# -- command line --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from planner.arguments import Parser

    ap = Parser(prog="plan calibrate", description="Refit a profile's overlap fractions and the efficiency "
                 "factors of its cost terms from measured runs (results CSV of `plan validate --append`, all rows "
                 "measured on the profile's GPU); accuracy is reported on held-out runs, split plan by plan.")
    ap.add_argument("results", help="results CSV written by `plan validate --append`")
    ap.add_argument("--profile", required=True, help="the profile to start from (IN)")
    ap.add_argument("-o", "--output", required=True, help="the calibrated profile to write (OUT)")
    ap.add_argument("--holdout-fraction", type=float, default=0.3,
                    help="share of runs kept out of the fit, whole plans at a time; in (0, 1) (default 0.3)")
    ap.add_argument("--holdout-models", default="",
                    help="comma-separated model names whose runs are all held out (instead of a random share)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the calibration / held-out split (default 0)")
    ap.add_argument("--plans", help="sidecar of plans (default: <results stem>.plans.jsonl beside the CSV)")
    ap.add_argument("--models", action="append", default=[],
                    help="folder of <name>/config.json model configs for rows without a sidecar plan (repeatable)")
    ap.add_argument("--grid-step", type=float, default=0.05,
                    help="grid step of the overlap fractions (default 0.05; efficiency factors use their own grid)")
    ap.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    ap.add_argument("--no-efficiency", action="store_true",
                    help="fit only the overlap fractions, not the efficiency factors of the cost terms")
    ap.add_argument("--terms", default="",
                    help="comma-separated efficiency terms to fit (default: every term the calibration runs are "
                         "sensitive to); the others keep the input profile's factors. With few runs, fitting "
                         "fewer terms keeps one from trading against another")
    return ap


def _fmt(acc: dict) -> str:
    if not acc.get("n"):
        return "no runs"
    return (f"n={acc['n']}: median |err| {acc['median_abs_rel_error']:.1%}, worst {acc['worst_abs_rel_error']:.1%}, "
            f"median signed {acc['median_signed_rel_error']:+.1%}")


def asked_terms(text: str) -> list[str]:
    """--terms as a list; an unknown term is refused before any fitting."""
    from planner.profile import EFFICIENCY_TERMS

    asked = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in asked if t not in EFFICIENCY_TERMS]
    if unknown:
        raise PlanError(f"--terms: unknown efficiency term(s) {', '.join(unknown)}; the terms are "
                        f"{', '.join(EFFICIENCY_TERMS)}")
    return asked


def main(argv=None) -> int:
    from planner.outputs import check_output_file
    from planner.profile import Profile, resolve_profile_path

    args = build_parser().parse_args(argv)
    if not args.holdout_models and not 0 < args.holdout_fraction < 1:
        # 0 would report "held-out" accuracy on no runs at all: the fit's own accuracy is no guarantee
        raise PlanError(f"--holdout-fraction must be in (0, 1), got {args.holdout_fraction} (or name the held-out "
                        "models with --holdout-models)")
    if not 0 < args.grid_step <= 0.5:
        raise PlanError(f"--grid-step must be in (0, 0.5], got {args.grid_step}")
    asked = asked_terms(args.terms)
    # Profile.load checks every number; which GPU the profile must match is the rows' business (check_rows_gpu)
    profile = Profile.load(resolve_profile_path(args.profile))
    results = Path(args.results)
    rows = read_results(results)
    check_rows_gpu(rows, profile.gpu, results, args.profile)
    side_path = Path(args.plans) if args.plans else sidecar_path(results)
    sidecar = read_sidecar(side_path)
    model_dirs = [Path(d) for d in args.models] + [Path(__file__).resolve().parent.parent / "benchmarks" / "models"]
    runs, skipped = rows_to_runs(rows, sidecar, profile.gpu, model_dirs)
    if len(runs) < 2:
        raise PlanError(f"'{results}' has {len(runs)} usable measured run(s); calibration needs at least 2"
                        + (f" ({skipped[0]})" if skipped else ""))
    if args.holdout_models:
        names = {n.strip() for n in args.holdout_models.split(",") if n.strip()}
        hold = [r for r in runs if r.plan.model.name in names]
        cal = [r for r in runs if r.plan.model.name not in names]
        if not hold or not cal:
            raise PlanError(f"--holdout-models {args.holdout_models} leaves no {'held-out' if not hold else 'calibration'} runs")
    else:
        cal, hold = split_rows(runs, args.holdout_fraction, args.seed)
    out = Path(args.output)
    check_output_file(out, "-o", overwrite=args.force)  # before the fit, which takes minutes on a large file
    dims = sensitive_dims(cal, profile)
    before_cal, before_hold = accuracy(cal, profile), accuracy(hold, profile)
    fitted = fit_overlap(cal, profile, dims, args.grid_step) if dims else dict(profile.overlap_hidden_fraction)
    new = with_overlap(profile, fitted)
    terms = [] if args.no_efficiency else sensitive_terms(cal, new)
    if asked:
        terms = [t for t in terms if t in asked]
    if terms:
        new = with_overlap(new, fitted, fit_efficiency(cal, new, terms))
    after_cal, after_hold = accuracy(cal, new), accuracy(hold, new)
    old_f = profile.overlap_hidden_fraction
    changed = {d: {"from": old_f.get(d, 0.0), "to": fitted[d]} for d in dims if abs(fitted[d] - old_f.get(d, 0.0)) > 1e-12}
    eff_changed = {t: {"from": profile.eff(t), "to": new.eff(t)} for t in terms if abs(new.eff(t) - profile.eff(t)) > 1e-12}

    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": "plan calibrate", "results": str(results), "plans": str(side_path) if sidecar else "",
        "from_profile": str(args.profile), "seed": args.seed, "holdout_fraction": args.holdout_fraction,
        "holdout_models": args.holdout_models,
        "split": "by model (--holdout-models)" if args.holdout_models else
                 "by plan: repeat runs of one plan stay on one side (plan_key)",
        "distinct_plans": len({plan_key(r) for r in runs}),
        "measured_on": sorted({r["gpu"] for r in rows}),
        "grid_step": args.grid_step, "objective": "median |predicted - measured| / measured step time",
        "changed": changed, "fitted_dims": dims, "efficiency_changed": eff_changed, "fitted_terms": terms, "unchanged": "measured kernel and collective times",
        "calibration_rows": [r.row for r in cal], "holdout_rows": [r.row for r in hold],
        "skipped_rows": skipped,
        "accuracy": {"calibration_before": before_cal, "calibration_after": after_cal,
                     "holdout_before": before_hold, "holdout_after": after_hold},
    }
    prov = dict(profile.provenance)
    prov["calibrations"] = list(prov.get("calibrations", [])) + [record]
    parts = list(prov.get("parts", []))
    if changed:
        parts.append({"part": "overlap_hidden_fraction " + ", ".join(changed),
                      "status": f"calibrated on {len(cal)} measured runs of {results} (rows: provenance.calibrations)"})
    if eff_changed:
        parts.append({"part": "efficiency " + ", ".join(eff_changed),
                      "status": f"calibrated on {len(cal)} measured runs of {results} (rows: provenance.calibrations)"})
    prov["parts"] = parts
    new.provenance = prov
    new.save(out)

    print(f"calibrated {args.profile} -> {out} from {results} ({len(runs)} runs of {record['plans']} plans: "
          f"{len(cal)} calibration, {len(hold)} held out; seed {args.seed})")
    for s in skipped:
        print(f"  skipped {s}")
    if not dims:
        print("  no overlap fraction affects the calibration runs' predictions; nothing changed")
    for d in dims:
        a, b = old_f.get(d, 0.0), fitted[d]
        print(f"  overlap_hidden_fraction[{d}]: {a:.3f} -> {b:.3f}" + ("" if d in changed else " (unchanged)"))
    for t in terms:
        print(f"  efficiency[{t}]: {profile.eff(t):.3f} -> {new.eff(t):.3f}" + ("" if t in eff_changed else " (unchanged)"))
    print(f"calibration runs  before: {_fmt(before_cal)}")
    print(f"                  after:  {_fmt(after_cal)}")
    print(f"held-out runs     before: {_fmt(before_hold)}")
    print(f"                  after:  {_fmt(after_hold)}")
    if hold:
        pred_b, pred_a = predict_all(hold, profile), predict_all(hold, new)
        print(f"  {'row':>4} {'run':<58} {'measured':>9} {'before':>9} {'after':>9} {'err':>7}")
        for r, b, a in zip(hold, pred_b, pred_a):
            print(f"  {r.row:>4} {r.label[:58]:<58} {r.measured_step_s:>9.4f} {b:>9.4f} {a:>9.4f} "
                  f"{(a - r.measured_step_s) / r.measured_step_s:>+7.1%}")
    return 0


if __name__ == "__main__":
    from planner.arguments import run_command
    sys.exit(run_command(main, sys.argv[1:]))
