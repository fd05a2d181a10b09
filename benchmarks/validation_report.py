"""Summarise `plan validate` results: step-time and memory error per layout kind, calibration against held-out
runs, plan quality (first choice against the measured best, Spearman rank correlation), and the plot of
predicted against measured. Every row is re-predicted from its exact plan (the CSV's sidecar) with the
profiles given, so the figures are those of the profiles as shipped, not of the profile a run was made with.

    python benchmarks/validation_report.py benchmarks/results/validation/current.csv \
        --profile profiles/h200-sxm.json --calibrated profiles/h200-sxm-calibrated.json \
        --holdout-models llama-1b-gqa,moe-small,bert-large --quality-models gpt-1.3b,llama-1b-gqa \
        --out benchmarks/results/validation-2026-11-30b
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.cluster import ClusterSpec  # noqa: E402
from planner.cost import evaluate  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.report import HOST_PACED_SHARE, host_paced  # noqa: E402
from planner.profile import load_profile  # noqa: E402


def kind_of(plan: Plan) -> str:
    lay = plan.layout
    parts = [f"{d.upper()}{getattr(lay, d)}" for d in ("tp", "pp", "dp", "cp", "ep") if getattr(lay, d) > 1]
    if lay.vpp > 1:
        parts.append("VPP")
    if lay.dp * lay.cp > 1:
        parts.append(lay.sharding)
    return " ".join(parts) or "1 GPU"


def load(csv: Path) -> tuple[pd.DataFrame, list[Plan]]:
    df = pd.read_csv(csv)
    side = {}
    for line in open(csv.with_suffix(".plans.jsonl")):
        d = json.loads(line)
        side[int(d["row"])] = Plan.from_dict(d["plan"])
    plans = [side[i + 1] for i in range(len(df))]
    return df, plans


def stats(err: pd.Series) -> str:
    if err.empty:
        return "no runs"
    return f"median |error| {err.abs().median():.1%}, worst {err.abs().max():.1%} (n={len(err)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--calibrated", required=True)
    ap.add_argument("--holdout-models", default="")
    ap.add_argument("--quality-models", default="")
    ap.add_argument("--quality-csv", type=Path, help="rows of the plan-quality set (default: the rows of those models)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    df, plans = load(args.csv)
    hold = {m for m in args.holdout_models.split(",") if m}
    df["kind"] = [kind_of(p) for p in plans]
    df["held_out"] = df.model.isin(hold)
    for tag, path in (("shipped", args.profile), ("calibrated", args.calibrated)):
        prof = load_profile(path, "h200-sxm")
        preds = [evaluate(p, ClusterSpec.from_dict(p.cluster), prof) for p in plans]
        df[f"pred_{tag}"] = [x.step_s for x in preds]
        df[f"err_{tag}"] = df[f"pred_{tag}"] / df.measured_step_s - 1
        if tag == "shipped":
            df["pred_mem"] = [max(x.memory_gib_per_rank) for x in preds]
            # reported apart: a host-paced plan's time depends on the machine's CPU (planner.report.host_paced)
            df["host_paced"] = [host_paced(x) for x in preds]
    df["mem_over"] = df.measured_mem_gib / df.pred_mem - 1
    mem = df.dropna(subset=["measured_mem_gib"])
    gpus = "/".join(str(int(g)) for g in sorted(df.gpus.unique()))
    devices = ", ".join(sorted(str(d) for d in df.gpu.unique()))
    lines = [f"# Predicted against measured (plan validate, {gpus} GPU(s): {devices})", "",
             f"{len(df)} runs of {df.model.nunique()} models; every row re-predicted from its plan with "
             f"`{args.profile}` (shipped) and `{args.calibrated}` (" + (
                 f"calibrated on the runs of {', '.join(sorted(set(df.model) - hold))}; held out: "
                 f"{', '.join(sorted(hold))})." if set(df.model) - hold else
                 "calibrated on other runs: every run here is held out).") + "", "",
             "Error = predicted / measured - 1 (negative: the planner predicted faster than measured).", "",
             "| set | shipped profile | calibrated profile |", "|---|---|---|"]
    for name, sel in (("calibration runs", ~df.held_out), ("held-out runs", df.held_out), ("all runs", df.index == df.index),
                      (f"held-out, GPU-paced (host < {HOST_PACED_SHARE:.0%} of the step)", df.held_out & ~df.host_paced),
                      ("held-out, host-paced", df.held_out & df.host_paced),
                      ("all GPU-paced", ~df.host_paced), ("all host-paced", df.host_paced)):
        g = df[sel]
        lines.append(f"| {name} | {stats(g.err_shipped)} | {stats(g.err_calibrated)} |")
    for m in sorted(df.model.unique()):
        g = df[df.model == m]
        lines.append(f"| {m}{' (held out)' if m in hold else ''} | {stats(g.err_shipped)} | {stats(g.err_calibrated)} |")
    lines += ["", f"Memory (shipped profile; the calibration does not touch it): median |error| "
              f"{(mem.measured_mem_gib / mem.pred_mem - 1).abs().median():.1%}; measured above predicted by more "
              f"than 5% in {(mem.mem_over > 0.05).sum()} of {len(mem)} runs, worst {mem.mem_over.max():+.1%}.", ""]
    by_kind = df.groupby("kind").agg(runs=("err_shipped", "size"),
                                     shipped_median=("err_shipped", "median"),
                                     calibrated_median=("err_calibrated", "median"),
                                     calibrated_worst=("err_calibrated", lambda s: s.abs().max()),
                                     mem_over_max=("mem_over", "max"))
    lines += ["Per layout kind (signed median errors; worst absolute):", "", "```",
              by_kind.to_string(float_format=lambda v: f"{v:+.3f}"), "```", ""]
    if args.quality_models:
        lines += ["## Plan quality: every layout the planner searches on 2 GPUs (seq 2048, global batch 8)", "",
                  "| model | plans | measured best | first choice (shipped), measured | vs best | "
                  "first choice (calibrated), measured | vs best | Spearman (shipped) | Spearman (calibrated) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        qdf = df
        if args.quality_csv:
            qrows, _ = load(args.quality_csv)
            qdf = df.iloc[:len(qrows)]
        for m in args.quality_models.split(","):
            g = qdf[qdf.model == m]
            if g.empty:
                continue
            best = g.measured_step_s.min()
            firsts = [g.loc[g[col].idxmin()] for col in ("pred_shipped", "pred_calibrated")]
            rho_s = g.pred_shipped.rank().corr(g.measured_step_s.rank())
            rho_c = g.pred_calibrated.rank().corr(g.measured_step_s.rank())
            cells = " | ".join(f"{f.kind} mb{int(f.micro_batch)} {f.measured_step_s:.4f} s | "
                               f"{f.measured_step_s / best - 1:+.1%}" for f in firsts)
            lines.append(f"| {m}{' (held out)' if m in hold else ''} | {len(g)} | {best:.4f} s | {cells} | "
                         f"{rho_s:.3f} | {rho_c:.3f} |")
        lines.append("")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    for kind, g in df.groupby("kind"):
        ax[0].scatter(g.measured_step_s, g.pred_shipped, label=kind, s=14)
        ax[1].scatter(g.measured_step_s, g.pred_calibrated, label=kind, s=14)
        ax[2].scatter(g.measured_mem_gib, g.pred_mem, label=kind, s=14)
    for a, unit, title in ((ax[0], "step time (s)", "shipped profile"), (ax[1], "step time (s)", "calibrated profile"),
                           (ax[2], "peak memory (GiB)", "memory")):
        lim = max(a.get_xlim()[1], a.get_ylim()[1])
        a.plot([0, lim], [0, lim], "k--", lw=1)
        a.set_xlabel(f"measured {unit}")
        a.set_ylabel(f"predicted {unit}")
        a.set_title(title)
    ax[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out / "predicted-vs-measured.png", dpi=110)
    df.to_csv(args.out / "repredicted.csv", index=False)
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
