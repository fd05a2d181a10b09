"""Summarise `plan validate` results: step-time and memory error, per dimension, and the plot of predicted
against measured step time.

    python benchmarks/validation_report.py benchmarks/results/validation-2026-11-30/v1/validation.csv \
        benchmarks/results/validation-2026-11-30/v2/validation.csv --out benchmarks/results/validation-2026-11-30
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def kind_of(row) -> str:
    parts = [d.upper() + "2" for d in ("tp", "pp", "dp", "cp", "ep") if row[d] > 1]
    if row["vpp"] > 1:
        parts.append("VPP2")
    if row["model"].startswith("moe"):
        parts.append("MoE")
    return " ".join(parts) or "1 GPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    df = pd.concat([pd.read_csv(f) for f in args.csv], ignore_index=True)
    df["step_err"] = df.predicted_step_s / df.measured_step_s - 1
    df["mem_over"] = df.measured_mem_gib / df.predicted_mem_gib - 1
    df["kind"] = df.apply(kind_of, axis=1)
    out = Path(args.out)
    by_kind = df.groupby("kind").agg(runs=("step_err", "size"), median_step_err=("step_err", "median"),
                                     worst_step_err=("step_err", lambda s: s.abs().max()),
                                     max_mem_over=("mem_over", "max"))
    lines = ["# Predicted against measured (plan validate)", "",
             f"{len(df)} runs; step time: median |error| {df.step_err.abs().median():.1%}, worst {df.step_err.abs().max():.1%}; "
             f"memory: median |error| {df.mem_over.abs().median():.2%}, worst measured-over-predicted {df.mem_over.max():+.1%}.",
             "", "Error = predicted / measured - 1 (negative: the planner predicted faster than measured).", "",
             "```", by_kind.to_string(float_format=lambda v: f"{v:.3f}"), "```", ""]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.5))
    for kind, g in df.groupby("kind"):
        ax[0].scatter(g.measured_step_s, g.predicted_step_s, label=kind)
        ax[1].scatter(g.measured_mem_gib, g.predicted_mem_gib, label=kind)
    for a, unit in ((ax[0], "step time (s)"), (ax[1], "peak memory (GiB)")):
        lim = max(a.get_xlim()[1], a.get_ylim()[1])
        a.plot([0, lim], [0, lim], "k--", lw=1)
        a.set_xlabel(f"measured {unit}")
        a.set_ylabel(f"predicted {unit}")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "predicted-vs-measured.png", dpi=110)
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
