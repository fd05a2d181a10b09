"""`plan calibrate RESULTS.csv --profile IN -o OUT`: refit the profile's overlap fractions from measured runs.

The measured kernel and collective times stay as they are; what calibration changes is the one set of
numbers in the profile that is a stated model rather than a measurement: `overlap_hidden_fraction` per
dimension (tp, dp, pp, cp, ep), the share of a dimension's communication that overlapped compute hides.

Rows of the results CSV (written by `plan validate --append`) are split at random (seeded) into calibration
rows and held-out rows. Each fraction that changes any calibration row's prediction is searched on a grid
(coordinate descent, then a finer grid around the best), minimising the median absolute relative error of
the predicted step time; ties go to the smaller mean error, then to the value nearest the original. The
output profile's provenance records what changed, from which rows (1-based data-row numbers of the CSV),
and the accuracy before and after on both the calibration and the held-out rows; the report printed is
the held-out accuracy, which calibration never saw.

Each row is re-predicted from its exact plan: `plan validate --append FILE` also appends the plan to
FILE's sidecar `<FILE stem>.plans.jsonl` (row number -> plan JSON), since the CSV's fixed columns do not
carry the sharding level, overlap switches or the model's full shape. A row without a sidecar entry is
rebuilt from its columns when that is unambiguous (a catalogue model or a config under --models, and
dp * cp == 1 so the sharding level is moot); otherwise it is skipped, and the report says so.

No torch import: this is planner code.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import random
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from planner.errors import PlanError

RESULT_COLUMNS = ["model", "gpus", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch", "seq_len",
                  "recompute", "predicted_step_s", "measured_step_s", "predicted_mem_gib", "measured_mem_gib",
                  "gpu", "profile", "commit", "date"]
"""One row a run: what `plan validate --append` writes and `plan calibrate` reads."""

DIMS = ("tp", "dp", "pp", "cp", "ep")

_STAGE_RE = re.compile(r"^(\d+)(?:f(\d+))?(?:s(\d+))?$")


def recompute_text(stages) -> str:
    """Per-stage layers and recompute in one compact token: stages joined by '+', each '<layers>' then
    'f<n>' (fully recomputed layers) and 's<n>' (selectively recomputed) when non-zero.
    '12+12': two stages of 12, no recompute; '8f8+8s2': stage 0 all full, stage 1 two selective."""
    out = []
    for s in stages:
        t = str(s.layers)
        if s.full_recompute_layers:
            t += f"f{s.full_recompute_layers}"
        if s.selective_recompute_layers:
            t += f"s{s.selective_recompute_layers}"
        out.append(t)
    return "+".join(out)


def parse_recompute_text(text: str):
    from planner.plan import StagePlan

    stages = []
    for part in text.strip().split("+"):
        m = _STAGE_RE.match(part.strip())
        if not m:
            raise PlanError(f"recompute field '{text}' is not in the '<layers>[f<n>][s<n>]+...' form")
        stages.append(StagePlan(int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0)))
    return stages


def sidecar_path(results: Path) -> Path:
    return Path(results).with_suffix(".plans.jsonl")


def read_results(path: Path) -> list[dict]:
    """Data rows with their 1-based row number under '_row'; refuses a file with other columns."""
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames != RESULT_COLUMNS:
                raise PlanError(f"'{path}' does not have the results columns ({', '.join(RESULT_COLUMNS)})")
            rows = list(reader)
    except FileNotFoundError:
        raise PlanError(f"results file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PlanError(f"results file '{path}' is not a readable CSV ({exc.__class__.__name__})") from None
    for i, r in enumerate(rows, 1):
        r["_row"] = i
    return rows


def read_sidecar(path: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    if not path.exists():
        return out
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out[int(d["row"])] = d["plan"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise PlanError(f"line {n} of '{path}' is not a {{\"row\", \"plan\"}} record") from None
    return out


def _float(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


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
                plan = Plan.from_dict(sidecar[n])
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
"""Candidate factors, 0.25x to 16x in steps of 2^(1/8) (9%) (the pipeline hop came out near 8x in session 9)."""
EFFICIENCY_FINE = [2 ** (j / 64) for j in range(-8, 9)]
"""Then around each factor found, steps of 2^(1/64) (1.1%) up to one coarse step either side: the compute factor
is a few percent off 1, where the coarse grid has only 0.917, 1 and 1.09 (session 13)."""


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


def fit_efficiency(runs: list[Run], profile, terms: list[str], passes: int = 4) -> dict:
    """Coordinate descent of the efficiency factors over EFFICIENCY_GRID, minimising the median absolute
    relative step-time error (ties: smaller mean error, then the factor nearest 1)."""
    cur = {t: profile.eff(t) for t in terms}
    cur = {**profile.efficiency, **cur}

    def best_over(t, values):
        scored = []
        for v in values:
            med, mean = _objective(runs, with_overlap(profile, profile.overlap_hidden_fraction, {**cur, t: v}))
            scored.append((round(med, 12), round(mean, 12), abs(math.log(v)), v))
        return min(scored)[3]

    for grid in (lambda t: EFFICIENCY_GRID, lambda t: [round(cur.get(t, 1.0) * f, 4) for f in EFFICIENCY_FINE]):
        for _ in range(passes):
            changed = False
            for t in terms:
                v = best_over(t, grid(t))
                if v != cur.get(t, 1.0):
                    cur[t], changed = v, True
            if not changed:
                break
    return {k: v for k, v in cur.items() if abs(v - 1.0) > 1e-12}


def predict_all(runs: list[Run], profile) -> list[float]:
    from planner.cost import evaluate

    return [evaluate(r.plan, r.cluster, profile).step_s for r in runs]


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


def split_rows(runs: list[Run], holdout_fraction: float, seed: int) -> tuple[list[Run], list[Run]]:
    order = list(runs)
    random.Random(seed).shuffle(order)
    n_hold = int(round(len(order) * holdout_fraction))
    if holdout_fraction > 0 and len(order) >= 2:
        n_hold = max(n_hold, 1)
    n_hold = min(n_hold, len(order) - 1)
    hold = sorted(order[:n_hold], key=lambda r: r.row)
    cal = sorted(order[n_hold:], key=lambda r: r.row)
    return cal, hold


# -- command line --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from planner.cli import _Parser

    ap = _Parser(prog="plan calibrate", description="Refit a profile's overlap fractions from measured runs "
                 "(results CSV of `plan validate --append`); accuracy is reported on held-out runs.")
    ap.add_argument("results", help="results CSV written by `plan validate --append`")
    ap.add_argument("--profile", required=True, help="the profile to start from (IN)")
    ap.add_argument("-o", "--output", required=True, help="the calibrated profile to write (OUT)")
    ap.add_argument("--holdout-fraction", type=float, default=0.3, help="share of runs kept out of the fit (default 0.3)")
    ap.add_argument("--holdout-models", default="",
                    help="comma-separated model names whose runs are all held out (instead of a random share)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the calibration / held-out split (default 0)")
    ap.add_argument("--plans", help="sidecar of plans (default: <results stem>.plans.jsonl beside the CSV)")
    ap.add_argument("--models", action="append", default=[],
                    help="folder of <name>/config.json model configs for rows without a sidecar plan (repeatable)")
    ap.add_argument("--grid-step", type=float, default=0.05, help="grid step of the fractions (default 0.05)")
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


def main(argv=None) -> int:
    from planner.profile import Profile, resolve_profile_path

    args = build_parser().parse_args(argv)
    if not 0 <= args.holdout_fraction < 1:
        raise PlanError(f"--holdout-fraction must be in [0, 1), got {args.holdout_fraction}")
    if not 0 < args.grid_step <= 0.5:
        raise PlanError(f"--grid-step must be in (0, 0.5], got {args.grid_step}")
    out = Path(args.output)
    if out.exists() and not args.force:
        raise PlanError(f"'{out}' already exists; pass --force to overwrite it")
    profile = Profile.load(resolve_profile_path(args.profile))
    results = Path(args.results)
    rows = read_results(results)
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
    dims = sensitive_dims(cal, profile)
    before_cal, before_hold = accuracy(cal, profile), accuracy(hold, profile)
    fitted = fit_overlap(cal, profile, dims, args.grid_step) if dims else dict(profile.overlap_hidden_fraction)
    new = with_overlap(profile, fitted)
    terms = [] if args.no_efficiency else sensitive_terms(cal, new)
    if args.terms:
        from planner.profile import EFFICIENCY_TERMS

        asked = [t.strip() for t in args.terms.split(",") if t.strip()]
        unknown = [t for t in asked if t not in EFFICIENCY_TERMS]
        if unknown:
            raise PlanError(f"--terms: unknown efficiency term(s) {', '.join(unknown)}; the terms are "
                            f"{', '.join(EFFICIENCY_TERMS)}")
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

    print(f"calibrated {args.profile} -> {out} from {results} ({len(runs)} runs: {len(cal)} calibration, "
          f"{len(hold)} held out; seed {args.seed})")
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
    from planner.cli import main as cli_main
    sys.exit(cli_main(["calibrate", *sys.argv[1:]]))
