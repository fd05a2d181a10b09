"""Plan every published run of benchmarks/published/runs.csv twice for its hardware and the Megatron target, and
compare with the published throughput.

Command that makes benchmarks/results/published/:
    PYTHONPATH=$PWD python benchmarks/published_check.py --force

Per row (benchmarks/published_rows.py builds its model, cluster and pins): (a) pinned to the published layout (TP, PP,
VPP, DP and sharding, CP, EP, micro-batch, recompute, FP8; empty cells free), (b) a free search keeping only the
numerics (FP8 or not, the main gradients' precision); both with `--runtime megatron` (planner/cost/targets.py, factors from profiles/targets/megatron.json).
Rows whose GPU kind has no profile on this tree are reported as skipped. Writes summary.json (pinned error per
split, feasibility, the share of rows where the free search reaches the published throughput), rows.csv, report.md,
predicted_vs_published.png and provenance.json, replacing the last result (--force).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(REPO / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from published_rows import deciding_term, load_rows, plan_row, tokens_per_s_per_gpu  # noqa: E402

from planner.cost.targets import load_target  # noqa: E402
from planner.errors import NoFitError, PlanError  # noqa: E402
from planner.provenance import commit_label, cpu_model  # noqa: E402

CODE_PATHS = ("planner", "profiles", "benchmarks/published", "benchmarks/published_rows.py",
              "benchmarks/published_check.py", "benchmarks/fit_megatron_target.py")
"""What the figures depend on: a commit label is marked dirty only for changes here (not for the results folder)."""

OUT = REPO / "benchmarks" / "results" / "published"
MISS = 0.10
"""A pinned prediction further than this from the published throughput is a miss and names its deciding term."""

COLUMNS = ["row_id", "split", "gpu", "num_gpus", "model", "status", "published_tok_s_gpu", "pinned_tok_s_gpu",
           "pinned_error", "pinned_layout", "pinned_mem_gib", "pinned_mem_limit_gib", "pinned_miss_term",
           "free_tok_s_gpu", "free_vs_published", "free_layout", "free_mb", "free_sharding", "free_recompute",
           "free_below_term", "notes"]


def _layout(plan) -> str:
    lay = plan.layout
    rc = sorted({m for s in plan.stages for m in s.layer_modes()})
    return f"{lay.short()} mb{lay.micro_batch} {lay.sharding} recompute {'/'.join(rc)}"


def check_row(row, target) -> dict:
    out = {"row_id": row.row_id, "split": row.split, "gpu": row.cluster.gpu, "num_gpus": row.cluster.num_gpus,
           "model": row.model.name, "published_tok_s_gpu": row.tokens_per_s_per_gpu, "notes": "; ".join(row.notes)}
    if row.skip_reason:
        out["status"] = f"skipped: {row.skip_reason}"
        return out
    profile = row.profile()
    try:
        pinned = plan_row(row, target, profile=profile)
        p = pinned.prediction
        tok = tokens_per_s_per_gpu(row, p)
        err = tok / row.tokens_per_s_per_gpu - 1
        out.update(status="ok", pinned_tok_s_gpu=round(tok, 2), pinned_error=round(err, 4),
                   pinned_layout=_layout(pinned), pinned_mem_gib=round(max(p.memory_gib_per_rank), 2),
                   pinned_mem_limit_gib=round(p.memory_limit_gib, 2),
                   pinned_miss_term=deciding_term(p, over=err > 0) if abs(err) > MISS else "")
    except NoFitError as exc:
        out.update(status="pinned layout does not fit in memory", pinned_miss_term=f"memory: {exc}")
    except PlanError as exc:
        out.update(status=f"pinned layout not plannable: {exc}")
    try:
        free = plan_row(row, target, free=True, profile=profile)
        q = free.prediction
        ftok = tokens_per_s_per_gpu(row, q)
        below = ftok < row.tokens_per_s_per_gpu
        out.update(free_tok_s_gpu=round(ftok, 2), free_vs_published=round(ftok / row.tokens_per_s_per_gpu - 1, 4),
                   free_layout=free.layout.short(), free_mb=free.layout.micro_batch, free_sharding=free.layout.sharding,
                   free_recompute="/".join(sorted({m for s in free.stages for m in s.layer_modes()})),
                   free_below_term=deciding_term(q) if below else "")
    except PlanError as exc:
        out.update(free_below_term=f"no free plan: {exc}")
    return out


def summarise(results: list[dict]) -> dict:
    def split_stats(split):
        errs = [abs(r["pinned_error"]) for r in results if r["split"] == split and r.get("pinned_error") is not None]
        return {"rows": len(errs), "median_abs_err": round(statistics.median(errs), 4) if errs else None,
                "worst_abs_err": round(max(errs), 4) if errs else None}

    planned = [r for r in results if not r["status"].startswith("skipped")]
    with_free = [r for r in planned if r.get("free_tok_s_gpu") is not None]
    return {
        "fit": split_stats("fit"),
        "holdout": split_stats("holdout"),
        "all_published_feasible": all(r["status"] == "ok" for r in planned),
        "free_ge_published_frac": round(sum(r["free_tok_s_gpu"] >= r["published_tok_s_gpu"] for r in with_free)
                                        / len(planned), 4) if planned else None,
    }


def write_plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    lo, hi = 1e9, 0.0
    for split, marker, color in (("fit", "o", "tab:blue"), ("holdout", "s", "tab:orange")):
        pts = [(r["published_tok_s_gpu"], r["pinned_tok_s_gpu"]) for r in results
               if r["split"] == split and r.get("pinned_tok_s_gpu") is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, marker=marker, color=color, label=f"{split} ({len(pts)} rows)")
            lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
    if hi > 0:
        ax.plot([lo / 1.5, hi * 1.5], [lo / 1.5, hi * 1.5], color="grey", lw=1, label="equal")
        for f, ls in ((1.1, ":"), (1.2, "--")):
            ax.plot([lo / 1.5, hi * 1.5], [lo / 1.5 * f, hi * 1.5 * f], color="grey", lw=0.6, ls=ls)
            ax.plot([lo / 1.5, hi * 1.5], [lo / 1.5 / f, hi * 1.5 / f], color="grey", lw=0.6, ls=ls)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published tokens/s per GPU")
    ax.set_ylabel("predicted tokens/s per GPU (pinned layout, --runtime megatron)")
    ax.set_title("Published runs: predicted against published\n(dotted: +-10%, dashed: +-20%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pct(v) -> str:
    return "" if v is None or v == "" else f"{v:+.1%}"


def write_report(results, summary, prov, path: Path) -> None:
    s = summary
    lines = ["# Published runs against the planner's Megatron target", "",
             f"`{prov['command']}` at commit {prov['commit']}, {prov['date']}, on {prov['machine']} "
             f"({prov['elapsed_s']:.0f} s).", "",
             f"Target: {prov['target']}.", "",
             "| split | rows | median abs error | worst abs error | bar (median / worst) |",
             "| --- | --- | --- | --- | --- |"]
    for split, bar in (("fit", "8% / 15%"), ("holdout", "10% / 20%")):
        v = s[split]
        med = "" if v["median_abs_err"] is None else f"{v['median_abs_err']:.1%}"
        worst = "" if v["worst_abs_err"] is None else f"{v['worst_abs_err']:.1%}"
        lines.append(f"| {split} | {v['rows']} | {med} | {worst} | {bar} |")
    lines += ["", f"Every pinned published layout fits in memory: **{s['all_published_feasible']}**. "
              f"Free search at least the published throughput: **{s['free_ge_published_frac']:.0%}** of the planned rows "
              "(bar 80%).", "", "![predicted against published](predicted_vs_published.png)", "",
              "| row | split | GPUs | model | published | pinned | error | pinned layout | miss: deciding term | "
              "free | free vs published | free layout | free below: deciding term |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if r["status"].startswith("skipped"):
            lines.append(f"| {r['row_id']} | {r['split']} | {r['num_gpus']} {r['gpu']} | {r['model']} | "
                         f"{r['published_tok_s_gpu']:g} | {r['status']} | | | | | | | |")
            continue
        pin = "" if r.get("pinned_tok_s_gpu") is None else f"{r['pinned_tok_s_gpu']:,.1f}"
        free = "" if r.get("free_tok_s_gpu") is None else f"{r['free_tok_s_gpu']:,.1f}"
        lines.append(f"| {r['row_id']} | {r['split']} | {r['num_gpus']} {r['gpu']} | {r['model']} | "
                     f"{r['published_tok_s_gpu']:,.1f} | {pin or r['status']} | {_pct(r.get('pinned_error'))} | "
                     f"{r.get('pinned_layout', '')} | {r.get('pinned_miss_term', '')} | {free} | "
                     f"{_pct(r.get('free_vs_published'))} | {r.get('free_layout', '')} mb{r.get('free_mb', '')} "
                     f"{r.get('free_sharding', '')} | {r.get('free_below_term', '')} |")
    notes = [(r["row_id"], r["notes"]) for r in results if r.get("notes")]
    if notes:
        lines += ["", "## Approximations per row", ""] + [f"- {rid}: {n}" for rid, n in notes]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default=str(OUT), help=f"folder (default {OUT.relative_to(REPO)})")
    ap.add_argument("--force", action="store_true", help="replace the last result in the folder")
    args = ap.parse_args(argv)
    out = Path(args.output)
    if (out / "summary.json").exists() and not args.force:
        print(f"published_check: '{out / 'summary.json'}' exists; pass --force to replace it", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    target = load_target("megatron")
    results = []
    for row in load_rows():
        r = check_row(row, target)
        results.append(r)
        print(f"{r['row_id']:14s} {r['split']:8s} {r['status'][:60]:60s} pinned {_pct(r.get('pinned_error')):>7s} "
              f"free {_pct(r.get('free_vs_published')):>7s}", flush=True)
    summary = summarise(results)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    commit = commit_label(dirty_paths=CODE_PATHS, mark_dirty=True)
    summary.update(commit=commit, date=date)
    prov = {"command": "PYTHONPATH=$PWD python benchmarks/published_check.py --force", "commit": commit,
            "machine": f"{platform.node() or 'unknown'} ({cpu_model() or 'unknown CPU'}, "
                       f"{__import__('os').cpu_count()} CPUs)", "date": date,
            "elapsed_s": round(time.perf_counter() - t0, 1), "target": target.describe(),
            "target_provenance": target.provenance,
            "rows_skipped": {r["row_id"]: r["status"] for r in results if r["status"].startswith("skipped")}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in results:
            w.writerow({k: r.get(k, "") for k in COLUMNS})
    write_plot(results, out / "predicted_vs_published.png")
    write_report(results, summary, prov, out / "report.md")
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}/summary.json, rows.csv, report.md, predicted_vs_published.png, provenance.json "
          f"({prov['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
