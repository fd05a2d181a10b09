"""`plan scaling`: the best plan at each GPU count, as a strong or weak scaling report.

For every GPU count of `--gpus` the search (planner.search) picks the best layout; the report gives its
predicted step time, tokens/s, TFLOP/s per GPU, MFU, scaling efficiency against the first point that has
a plan, memory headroom and time breakdown. Strong scaling keeps the global batch fixed; weak scaling
keeps the batch per GPU fixed (the global batch grows with the GPUs).

Writes DIR/scaling.csv (one row per series and GPU count, rows where nothing fits carry the reason),
DIR/throughput.png, DIR/efficiency.png, DIR/breakdown.png, DIR/memory.png and DIR/report.md.

What-if series: `--compare-gpu KIND` (another GPU kind; its shipped profile, `--compare-profile`, or the
baseline profile rescaled by datasheet ratios, which the report marks as modelled) and
`--compare-inter-node-gbps X` (another network bandwidth per GPU). `--tokens T` adds the time and the
GPU-hours to train T tokens. `--validate-csv FILE` overlays measured points from `plan validate`.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.errors import PlanError

VALIDATE_COLUMNS = ("model", "gpus", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch", "seq_len",
                    "recompute", "predicted_step_s", "measured_step_s", "predicted_mem_gib", "measured_mem_gib",
                    "gpu", "profile", "commit", "date")
DEFAULT_TOP_K = 1
"""Only the best plan of each point is reported; top_k 1 keeps gpt-70b over 8..1024 GPUs within seconds."""


# -- arguments ------------------------------------------------------------------------------------------

def _gpu_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes a comma-separated list of whole numbers, got '{s}'") from None
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"--gpus takes positive GPU counts, got '{s}'")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"--gpus lists a GPU count twice: '{s}'")
    return sorted(out)


def _tokens(s: str) -> float:
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = s.strip().lower()
    try:
        v = float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens takes a number such as 2e12 or 300B, got '{s}'") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"--tokens must be positive, got '{s}'")
    return v


def build_parser() -> argparse.ArgumentParser:
    from planner.cli import _Parser, _positive_float, _positive_int, add_model_cluster_args
    from planner.cluster import GPU_KINDS

    ap = _Parser(prog="plan scaling", description="Strong or weak scaling report: the best plan at each GPU count, "
                 "with CSV, plots and a Markdown report.")
    add_model_cluster_args(ap, gpus_required=False)
    ap.add_argument("--gpus", type=_gpu_list, required=True, help="GPU counts, e.g. 8,16,32,64")
    ap.add_argument("--weak", action="store_true",
                    help="weak scaling: the batch per GPU stays fixed and the global batch grows with the GPUs")
    ap.add_argument("--batch-per-gpu", type=_positive_float("--batch-per-gpu"),
                    help="sequences per GPU per step (the global batch is this times the GPU count); "
                         "excludes --global-batch")
    ap.add_argument("--tokens", type=_tokens, help="add the time and GPU-hours to train this many tokens (e.g. 2e12, 300B)")
    ap.add_argument("--compare-gpu", choices=sorted(k for k in GPU_KINDS if k != "cpu"),
                    help="what-if: a second series on this GPU kind")
    ap.add_argument("--compare-profile", help="profile JSON for --compare-gpu (default: the shipped one, else the "
                    "baseline profile rescaled by datasheet ratios)")
    ap.add_argument("--compare-inter-node-gbps", type=_positive_float("--compare-inter-node-gbps"),
                    help="what-if: a second series with this network bandwidth per GPU (GB/s)")
    ap.add_argument("--validate-csv", help="results CSV of `plan validate`: overlay its measured points")
    ap.add_argument("--top-k", type=_positive_int("--top-k"), default=DEFAULT_TOP_K,
                    help=f"plans kept per point by the search (default {DEFAULT_TOP_K}; only the best is reported)")
    ap.add_argument("-o", "--output", required=True, help="folder for scaling.csv, the plots and report.md")
    ap.add_argument("--force", action="store_true", help="overwrite an existing DIR/scaling.csv")
    return ap


# -- series and points ------------------------------------------------------------------------------------

@dataclass
class Series:
    name: str
    gpu: str
    inter_node_gbps: float | None
    profile: object
    notes: list[str] = field(default_factory=list)


def derive_profile(base, gpu: str):
    """The baseline profile carried to another GPU kind by datasheet ratios (modelled, and marked so):
    GEMM and attention rates scale with the dense bf16 peak, memory-bound work with HBM bandwidth,
    NVLink collectives with NVLink bandwidth; latencies are kept."""
    from planner.cluster import GPU_KINDS

    src, dst = GPU_KINDS[base.gpu] if base.gpu in GPU_KINDS else None, GPU_KINDS[gpu]
    if src is None:
        raise PlanError(f"cannot rescale a profile measured on '{base.gpu}' to {gpu}; pass --compare-profile")
    peak = dst.peak_bf16_tflops / src.peak_bf16_tflops
    hbm = dst.hbm_tb_per_s / src.hbm_tb_per_s
    nvl = dst.nvlink_gb_per_s / src.nvlink_gb_per_s
    colls = [replace(c, bus_bandwidth_bytes_per_s=c.bus_bandwidth_bytes_per_s * (nvl if c.link == "nvlink" else 1.0),
                     measured=False) for c in base.collectives]
    note = (f"what-if {gpu}: derived from the {base.gpu} profile by datasheet ratios (compute x{peak:.2f}, "
            f"HBM x{hbm:.2f}, NVLink x{nvl:.2f}); no {gpu} measurement")
    prov = dict(base.provenance)
    prov["kind"] = "modelled (rescaled)"
    prov["modelled"] = list(prov.get("modelled", [])) + [note]
    return replace(base, gpu=gpu, provenance=prov,
                   gemm_points=[(m, n, k, t / peak) for m, n, k, t in base.gemm_points],
                   wgrad_points=[(m, n, k, t / peak) for m, n, k, t in base.wgrad_points],
                   attention_points=[{**p, "fwd_tflops": p["fwd_tflops"] * peak, "bwd_tflops": p["bwd_tflops"] * peak}
                                     for p in base.attention_points],
                   copy_bandwidth_bytes_per_s=base.copy_bandwidth_bytes_per_s * hbm,
                   optimizer_s_per_param=base.optimizer_s_per_param / hbm,
                   collectives=colls, source_path=f"{base.source_path or base.gpu} rescaled to {gpu}"), note


def _global_batch(args, model, n: int, n0: int) -> int:
    """Sequences per step at n GPUs."""
    if args.batch_per_gpu is not None:
        gb = args.batch_per_gpu * (n if args.weak else n0)
    else:
        base = args.global_batch or model.default_global_batch
        gb = base * n / n0 if args.weak else base
    if abs(gb - round(gb)) > 1e-9:
        raise PlanError(f"the global batch at {n} GPUs would be {gb:g} sequences, not a whole number; "
                        "choose a batch that divides evenly")
    return int(round(gb))


def _recompute_label(plan) -> str:
    full = sum(s.full_recompute_layers for s in plan.stages)
    sel = sum(s.selective_recompute_layers for s in plan.stages)
    n = plan.model.num_layers
    parts = ([f"selective {sel}/{n}"] if sel else []) + ([f"full {full}/{n}"] if full else [])
    return ", ".join(parts) or "none"


def _layers_per_rank(plan) -> str:
    return " ".join(str(sum(plan.stages[j].layers for j in plan.stages_of_rank(r))) for r in range(plan.layout.pp))


def run_point(args, series: Series, model, n: int, n0: int, top_k: int) -> tuple[dict, object | None]:
    """One row of the CSV and the best plan (None when nothing fits or the point is impossible)."""
    from planner.cli import resolve_inputs
    from planner.report import BREAKDOWN_ORDER
    from planner.search import Pins, search

    row: dict = {"series": series.name, "gpu": series.gpu, "gpus": n}
    t0 = time.perf_counter()
    try:
        gb = _global_batch(args, model, n, n0)
        row["global_batch"] = gb
        # the baseline's model / cluster / shape checks; the series swaps GPU kind and network afterwards
        m, cluster, shape, _ = resolve_inputs(argparse.Namespace(**{**vars(args), "gpus": n, "global_batch": gb}))
        if series.inter_node_gbps is not None:
            cluster = replace(cluster, inter_node_gb_per_s=series.inter_node_gbps)
        if series.gpu != cluster.gpu:
            cluster = replace(cluster, gpu=series.gpu)
        row.update(nodes=cluster.num_nodes, seq_len=shape.seq_len, tokens_per_step=shape.seq_len * shape.global_batch)
        result = search(m, shape, cluster, series.profile, Pins(), top_k=top_k)
    except PlanError as exc:
        row.update(status="no fit" if exc.exit_code == 2 else "impossible", reason=str(exc),
                   search_s=time.perf_counter() - t0)
        return row, None
    except Exception as exc:  # noqa: BLE001 - a planner fault at one point must not lose the others
        row.update(status="error", reason=f"planner error {exc.__class__.__name__}: {exc}",
                   search_s=time.perf_counter() - t0)
        return row, None
    plan = result.plans[0]
    p, lay = plan.prediction, plan.layout
    mem_max = max(p.memory_gib_per_rank)
    row.update(status="ok", reason="", layout=lay.short(), tp=lay.tp, pp=lay.pp, vpp=lay.vpp, dp=lay.dp, cp=lay.cp,
               ep=lay.ep, micro_batch=lay.micro_batch, num_micro_batches=plan.num_micro_batches, sharding=lay.sharding,
               recompute=_recompute_label(plan), layers_per_rank=_layers_per_rank(plan),
               step_s=p.step_s, tokens_per_s=p.tokens_per_s, tokens_per_s_per_gpu=p.tokens_per_s / n,
               tflops_per_gpu=p.tflops_per_gpu, mfu=p.mfu, mem_max_gib=mem_max, mem_limit_gib=p.memory_limit_gib,
               mem_headroom_gib=p.memory_limit_gib - mem_max, mem_headroom_pct=1 - mem_max / p.memory_limit_gib,
               mem_per_rank_gib=json.dumps([round(x, 3) for x in p.memory_gib_per_rank]),
               search_s=time.perf_counter() - t0, gap_to_bound=result.stats.gap_to_bound,
               profile_kind=plan.provenance.get("profile_kind", ""))
    for k in BREAKDOWN_ORDER:
        row[f"t_{k}_s"] = p.breakdown_s.get(k, 0.0)
    if args.tokens:
        hours = args.tokens / p.tokens_per_s / 3600
        row.update(train_tokens=args.tokens, train_days=hours / 24, gpu_hours=hours * n)
    return row, plan


def add_efficiency(df):
    """Scaling efficiency per series: tokens/s per GPU over that of the series' first point with a plan
    (the same for strong and weak scaling); and the ideal line from that point."""
    import numpy as np

    df["efficiency"] = np.nan
    df["ideal_tokens_per_s"] = np.nan
    for name, grp in df.groupby("series", sort=False):
        ok = grp[grp["status"] == "ok"]
        if ok.empty:
            continue
        first = ok.iloc[0]
        per_gpu0 = first["tokens_per_s"] / first["gpus"]
        df.loc[grp.index, "ideal_tokens_per_s"] = per_gpu0 * grp["gpus"]
        df.loc[ok.index, "efficiency"] = ok["tokens_per_s"] / ok["gpus"] / per_gpu0
    return df


def load_validate_csv(path: str, model, gpus: list[int]):
    """Measured rows of a `plan validate` results CSV for this model and these GPU counts."""
    import pandas as pd

    try:
        v = pd.read_csv(path)
    except FileNotFoundError:
        raise PlanError(f"validate CSV '{path}' does not exist") from None
    except Exception as exc:  # noqa: BLE001 - pandas raises many kinds for a bad file
        raise PlanError(f"validate CSV '{path}' is not a readable CSV ({exc.__class__.__name__})") from None
    missing = [c for c in ("model", "gpus", "global_batch", "seq_len", "measured_step_s") if c not in v.columns]
    if missing:
        raise PlanError(f"validate CSV '{path}' lacks the column(s) {', '.join(missing)} "
                        f"(expected the columns of `plan validate`: {', '.join(VALIDATE_COLUMNS)})")
    v = v[(v["model"].astype(str) == model.name) & (v["gpus"].isin(gpus))].copy()
    v = v[pd.to_numeric(v["measured_step_s"], errors="coerce") > 0]
    if v.empty:
        return v
    v["measured_step_s"] = v["measured_step_s"].astype(float)
    v["measured_tokens_per_s"] = v["global_batch"] * v["seq_len"] / v["measured_step_s"]
    return v


def attach_measured(df, measured, model, peak_tflops: dict):
    """Columns measured_*: per (gpu kind, GPU count) the fastest measured run, its MFU and memory."""
    import numpy as np

    for c in ("measured_step_s", "measured_tokens_per_s", "measured_mfu", "measured_mem_gib", "measured_layout",
              "measured_vs_predicted"):
        df[c] = np.nan if c != "measured_layout" else ""
    if measured is None or measured.empty:
        return df
    for i, row in df.iterrows():
        m = measured[measured["gpus"] == row["gpus"]]
        if "gpu" in m.columns:
            m = m[m["gpu"].isna() | (m["gpu"].astype(str) == row["gpu"]) | (m["gpu"].astype(str) == "")]
        if m.empty:
            continue
        best = m.loc[m["measured_tokens_per_s"].idxmax()]
        flops = model.model_flops_per_token(int(best["seq_len"]))
        df.at[i, "measured_tokens_per_s"] = best["measured_tokens_per_s"]
        df.at[i, "measured_step_s"] = best["measured_step_s"]
        df.at[i, "measured_mfu"] = best["measured_tokens_per_s"] * flops / row["gpus"] / (peak_tflops[row["gpu"]] * 1e12)
        if "measured_mem_gib" in best:
            df.at[i, "measured_mem_gib"] = best["measured_mem_gib"]
        if all(c in best for c in ("tp", "pp", "dp")):
            df.at[i, "measured_layout"] = f"TP{best['tp']} PP{best['pp']} DP{best['dp']}" + \
                (f" CP{best['cp']}" if "cp" in best and best["cp"] > 1 else "")
        if "predicted_step_s" in best and best["predicted_step_s"] > 0:
            df.at[i, "measured_vs_predicted"] = best["measured_step_s"] / best["predicted_step_s"]
    return df


# -- plots ------------------------------------------------------------------------------------------------

def write_plots(df, measured, out: Path, title: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.report import BREAKDOWN_LABEL, BREAKDOWN_ORDER

    files = []
    series = list(dict.fromkeys(df["series"]))
    styles = ["o-", "s--", "^-.", "d:"]
    gpus = sorted(df["gpus"].unique())

    def logx(ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus)
        ax.set_xticklabels([str(g) for g in gpus])
        ax.set_xlabel("GPUs")
        ax.grid(True, which="both", alpha=0.3)

    # throughput against GPUs, with the ideal line
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s, st in zip(series, styles):
        g = df[df["series"] == s]
        ok = g[g["status"] == "ok"]
        line, = ax.plot(ok["gpus"], ok["tokens_per_s"], st, label=f"predicted: {s}")
        if g["ideal_tokens_per_s"].notna().any():
            ax.plot(g["gpus"], g["ideal_tokens_per_s"], ":", color=line.get_color(), alpha=0.6, label=f"ideal: {s}")
        for _, r in g[g["status"] != "ok"].iterrows():
            ax.annotate("no plan", (r["gpus"], ax.get_ylim()[0] if ok.empty else ok["tokens_per_s"].min()),
                        color=line.get_color(), fontsize=7, rotation=90, ha="center")
    if measured is not None and not measured.empty:
        ax.plot(measured["gpus"], measured["measured_tokens_per_s"], "kx", ms=9, mew=2, label="measured (plan validate)")
    logx(ax)
    ax.set_yscale("log")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"Throughput: {title}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)
    files.append("throughput.png")

    # MFU and scaling efficiency
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for s, st in zip(series, styles):
        ok = df[(df["series"] == s) & (df["status"] == "ok")]
        a1.plot(ok["gpus"], ok["mfu"] * 100, st, label=s)
        a2.plot(ok["gpus"], ok["efficiency"] * 100, st, label=s)
    if "measured_mfu" in df and df["measured_mfu"].notna().any():
        mm = df[df["measured_mfu"].notna()]
        a1.plot(mm["gpus"], mm["measured_mfu"] * 100, "kx", ms=9, mew=2, label="measured")
    for a, lab in ((a1, "MFU (%)"), (a2, "scaling efficiency (%)")):
        logx(a)
        a.set_ylabel(lab)
        a.set_ylim(bottom=0)
        a.legend(fontsize=7)
    a2.axhline(100, color="grey", lw=0.8, ls=":")
    a1.set_title("Model FLOPs utilisation", fontsize=10)
    a2.set_title("Tokens/s per GPU against the first point", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "efficiency.png", dpi=120)
    plt.close(fig)
    files.append("efficiency.png")

    # stacked breakdown per point (share of the step), one panel per series
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4.5), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, s in zip(axes[0], series):
        ok = df[(df["series"] == s) & (df["status"] == "ok")]
        x = [str(g) for g in ok["gpus"]]
        bottom = [0.0] * len(ok)
        for k, c in zip(BREAKDOWN_ORDER, colors):
            share = (ok[f"t_{k}_s"] / ok["step_s"] * 100).tolist() if len(ok) else []
            if not any(v > 0.05 for v in share):
                continue
            ax.bar(x, share, bottom=bottom, color=c, label=BREAKDOWN_LABEL[k])
            bottom = [b + v for b, v in zip(bottom, share)]
        for xi, (_, r) in zip(x, ok.iterrows()):
            ax.text(xi, 101, f"{r['step_s']:.2f}s", ha="center", fontsize=7)
        ax.set_ylim(0, 110)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("share of the step (%)")
        ax.set_title(f"Where the step goes: {s}", fontsize=10)
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=120)
    plt.close(fig)
    files.append("breakdown.png")

    # memory per pipeline rank against the limit
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s, st in zip(series, styles):
        ok = df[(df["series"] == s) & (df["status"] == "ok")]
        if ok.empty:
            continue
        xs, ys = [], []
        for _, r in ok.iterrows():
            ranks = json.loads(r["mem_per_rank_gib"])
            xs += [r["gpus"]] * len(ranks)
            ys += ranks
        pts = ax.plot(xs, ys, st[0], alpha=0.35, ms=4, label=f"each pipeline rank: {s}")
        ax.plot(ok["gpus"], ok["mem_max_gib"], st, color=pts[0].get_color(), label=f"busiest rank: {s}")
        ax.plot(ok["gpus"], ok["mem_limit_gib"], "-", color=pts[0].get_color(), lw=2, alpha=0.5,
                label=f"limit: {s} ({ok['mem_limit_gib'].iloc[0]:.0f} GiB)")
    if "measured_mem_gib" in df and df["measured_mem_gib"].notna().any():
        mm = df[df["measured_mem_gib"].notna()]
        ax.plot(mm["gpus"], mm["measured_mem_gib"], "kx", ms=9, mew=2, label="measured peak")
    logx(ax)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("predicted peak memory (GiB)")
    ax.set_title("Memory per pipeline rank against the planner's limit", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)
    files.append("memory.png")
    return files


# -- report -----------------------------------------------------------------------------------------------

def _fmt(v, spec):
    try:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def write_report(df, measured, out: Path, args, model, series_list, plans, argv, elapsed_s: float) -> None:
    from planner.report import BREAKDOWN_LABEL, BREAKDOWN_ORDER

    mode = "weak" if args.weak else "strong"
    base = series_list[0]
    first_ok = df[(df["series"] == base.name) & (df["status"] == "ok")]
    lines = [f"# Scaling report: {model.name}, {mode} scaling", ""]
    lines.append(f"`plan scaling {' '.join(argv)}`  ")
    lines.append(f"{model.name}: {model.total_params() / 1e9:.1f}B parameters, {model.num_layers} layers, hidden "
                 f"{model.hidden}. GPU counts {', '.join(str(g) for g in sorted(df['gpus'].unique()))}; "
                 f"{args.gpus_per_node} GPUs per node; network {args.inter_node_gbps:g} GB/s per GPU.  ")
    gbs = sorted(set(int(x) for x in df["global_batch"].dropna()))
    seq = int(df["seq_len"].dropna().iloc[0]) if df["seq_len"].notna().any() else model.default_seq_len
    if args.weak:
        lines.append(f"Weak scaling: the batch per GPU is fixed, the global batch grows from {gbs[0]} to {gbs[-1]} "
                     f"sequences of {seq} tokens.  ")
    else:
        lines.append(f"Strong scaling: a fixed global batch of {gbs[0] if gbs else '?'} sequences of {seq} tokens "
                     f"({(gbs[0] if gbs else 0) * seq / 1e6:.2f}M tokens per step).  ")
    lines.append(f"Searched in {elapsed_s:.1f} s. Scaling efficiency is tokens/s per GPU over that of the first GPU "
                 "count with a plan (1.0 is perfect scaling).")
    lines.append("")
    lines.append("![throughput](throughput.png)")
    lines.append("")
    for s in series_list:
        g = df[df["series"] == s.name]
        lines.append(f"## {s.name}")
        lines += [f"- {n}" for n in s.notes]
        lines.append("")
        cols = ["GPUs", "layout", "mb", "sharding", "recompute", "step s", "tokens/s", "TFLOP/s/GPU", "MFU",
                "efficiency", "mem GiB (limit)", "headroom"]
        if args.tokens:
            cols += ["days", "GPU-hours"]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        for _, r in g.iterrows():
            if r["status"] != "ok":
                lines.append(f"| {r['gpus']} | {r['status']}: {r['reason']} |" + " |" * (len(cols) - 2))
                continue
            cells = [str(r["gpus"]), r["layout"], str(int(r["micro_batch"])),
                     r["sharding"], r["recompute"], _fmt(r["step_s"], ".3f"), _fmt(r["tokens_per_s"], ",.0f"),
                     _fmt(r["tflops_per_gpu"], ".0f"), _fmt(r["mfu"], ".1%"), _fmt(r["efficiency"], ".2f"),
                     f"{r['mem_max_gib']:.1f} ({r['mem_limit_gib']:.1f})", _fmt(r["mem_headroom_pct"], ".0%")]
            if args.tokens:
                cells += [_fmt(r.get("train_days"), ".1f"), _fmt(r.get("gpu_hours"), ",.0f")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        ok = g[g["status"] == "ok"]
        if len(ok) >= 2:
            last = ok.iloc[-1]
            parts = {k: last[f"t_{k}_s"] for k in BREAKDOWN_ORDER if k not in ("compute",)}
            worst = max(parts, key=parts.get)
            first = ok.iloc[0]
            lines.append(f"From {first['gpus']} to {last['gpus']} GPUs the predicted throughput grows "
                         f"{last['tokens_per_s'] / first['tokens_per_s']:.1f}x for {last['gpus'] / first['gpus']:.0f}x "
                         f"the GPUs (efficiency {last['efficiency']:.0%}); at {last['gpus']} GPUs compute is "
                         f"{last['t_compute_s'] / last['step_s']:.0%} of the step and the largest other part is "
                         f"{BREAKDOWN_LABEL[worst]} ({parts[worst] / last['step_s']:.0%}).")
            low = ok[ok["efficiency"] < 0.8]
            if not low.empty:
                lines.append(f"Efficiency falls below 80% at {int(low.iloc[0]['gpus'])} GPUs.")
            lines.append("")
    lines += ["## Efficiency and MFU", "", "![efficiency](efficiency.png)", "",
              "## Where the time goes", "",
              "Share of the predicted step (slowest pipeline rank) per part; the label over each bar is the step time.",
              "", "![breakdown](breakdown.png)", ""]
    bcols = [k for k in BREAKDOWN_ORDER if (df.get(f"t_{k}_s", 0) > 0).any()]
    if bcols and not first_ok.empty:
        lines.append("| GPUs | " + " | ".join(BREAKDOWN_LABEL[k] for k in bcols) + " |")
        lines.append("|---|" + "---|" * len(bcols))
        for _, r in first_ok.iterrows():
            lines.append(f"| {r['gpus']} | " + " | ".join(f"{r[f't_{k}_s']:.3f}" for k in bcols) + " |")
        lines.append("")
    lines += ["## Memory", "", "Predicted peak allocated memory of every pipeline rank against what the planner "
              "allows per GPU (capacity less the reserve and fragmentation margin).", "", "![memory](memory.png)", ""]
    lines.append("## The plan at each point")
    lines.append("")
    for (sname, n), plan in plans.items():
        if sname != base.name:
            continue
        lay = plan.layout
        lines.append(f"- **{n} GPUs**: {lay.short()}" + (f", {lay.vpp} virtual stages" if lay.vpp > 1 else "")
                     + f", micro-batch {lay.micro_batch} x {plan.num_micro_batches}, sharding {lay.sharding}"
                     + (", sequence parallel" if lay.sequence_parallel else "")
                     + f"; layers per pipeline rank: {_layers_per_rank(plan)}; recompute: {_recompute_label(plan)}")
    lines.append("")
    lines.append("Write any of these as a plan file with `plan --model ... --gpus N -o plan.json`, then "
                 "`plan export plan.json --to megatron|torchrun|slurm`.")
    lines.append("")
    # measured overlay
    lines.append("## Measured points")
    lines.append("")
    if measured is None:
        lines.append("None given (pass `--validate-csv` with the results CSV of `plan validate`).")
    elif measured.empty:
        lines.append(f"The validate CSV `{args.validate_csv}` holds no run of {model.name} at these GPU counts.")
    else:
        lines.append(f"From `{args.validate_csv}` (runs of {model.name} at these GPU counts); the crosses in the plots.")
        lines.append("")
        lines.append("| GPUs | layout | global batch | predicted step s | measured step s | measured/predicted | "
                     "measured tokens/s | predicted mem GiB | measured mem GiB | gpu | commit | date |")
        lines.append("|" + "---|" * 12)
        for _, r in measured.iterrows():
            lay = " ".join(f"{k.upper()}{int(r[k])}" for k in ("tp", "pp", "dp", "cp", "ep")
                           if k in r and not _isnan(r[k]) and (k in ("tp", "pp", "dp") or r[k] > 1))
            pred = r.get("predicted_step_s", float("nan"))
            lines.append(f"| {r['gpus']} | {lay} | {r['global_batch']} | {_fmt(pred, '.3f')} | "
                         f"{r['measured_step_s']:.3f} | {_fmt(r['measured_step_s'] / pred if pred and not _isnan(pred) else float('nan'), '.2f')} | "
                         f"{r['measured_tokens_per_s']:,.0f} | {_fmt(r.get('predicted_mem_gib'), '.1f')} | "
                         f"{_fmt(r.get('measured_mem_gib'), '.1f')} | {r.get('gpu', '')} | {r.get('commit', '')} | {r.get('date', '')} |")
        if not args.weak and (measured["global_batch"] != gbs[0]).any():
            lines.append("")
            lines.append("Some measured runs used another global batch than this report; their tokens/s are "
                         "comparable, their step times are not.")
    lines.append("")
    # provenance
    lines.append("## Provenance of the figures")
    lines.append("")
    lines.append("Every figure above is a prediction of the cost model except the measured points. The predictions "
                 "rest on:")
    lines.append("")
    for s in series_list:
        prov = s.profile.provenance
        lines.append(f"- **{s.name}**: profile `{s.profile.source_path or s.profile.gpu}` ({prov.get('kind', 'measured')}"
                     + (f", {prov['measured_on']}" if prov.get("measured_on") else "")
                     + (f", {prov['date']}" if prov.get("date") else "") + ")")
        for item in prov.get("measured", []):
            lines.append(f"  - measured: {item}")
        for item in prov.get("modelled", []):
            lines.append(f"  - modelled: {item}")
    multi = df[(df["status"] == "ok") & (df["nodes"] > 1)]
    if not multi.empty:
        lines.append(f"- Points of more than one node ({', '.join(str(g) for g in sorted(multi['gpus'].unique()))} GPUs) "
                     "price their inter-node groups with the stated network bandwidth and latency: modelled, not measured.")
    from planner import memory as mem
    lines.append(f"- Memory: counted per tensor; allowance {mem.RESERVED_GIB} GiB outside the allocator and "
                 f"{mem.FRAGMENTATION:.0%} fragmentation (modelled).")
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        lines.append("")
        lines.append("## Points without a plan")
        lines.append("")
        for _, r in bad.iterrows():
            lines.append(f"- {r['series']}, {r['gpus']} GPUs ({r['status']}): {r['reason']}")
    lines.append("")
    lines.append("Files: `scaling.csv` (one row per series and GPU count; `t_*_s` columns are the breakdown in seconds), "
                 "`throughput.png`, `efficiency.png`, `breakdown.png`, `memory.png`.")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def _isnan(v) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


# -- main -------------------------------------------------------------------------------------------------

def make_series(args, model) -> list[Series]:
    from planner.cluster import load_cluster_file
    from planner.profile import load_profile, shipped_profile_path

    gpu = args.gpu
    inter = args.inter_node_gbps
    if args.cluster:
        c = load_cluster_file(args.cluster)
        gpu, inter = c.gpu, c.inter_node_gb_per_s
        args.gpu, args.inter_node_gbps, args.gpus_per_node = c.gpu, c.inter_node_gb_per_s, c.gpus_per_node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base_prof = load_profile(args.profile, gpu, other_gpu_ok=args.allow_other_gpu_profile)
    out = [Series(f"{gpu}, {inter:g} GB/s network", gpu, None, base_prof)]
    if args.compare_gpu:
        k = args.compare_gpu
        if args.compare_profile:
            prof, note = load_profile(args.compare_profile, k, args.allow_other_gpu_profile), f"profile {args.compare_profile}"
        elif shipped_profile_path(k).exists():
            prof, note = load_profile(None, k), f"the shipped {k} profile"
        else:
            prof, note = derive_profile(base_prof, k)
        out.append(Series(f"{k}, {inter:g} GB/s network", k, None, prof, [f"What-if: {note}."]))
    if args.compare_inter_node_gbps:
        x = args.compare_inter_node_gbps
        out.append(Series(f"{gpu}, {x:g} GB/s network", gpu, x, base_prof,
                          [f"What-if: network bandwidth {x:g} GB/s per GPU instead of {inter:g} (modelled)."]))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    if args.batch_per_gpu is not None and args.global_batch is not None:
        raise PlanError("give either --global-batch or --batch-per-gpu, not both")
    if args.compare_profile and not args.compare_gpu:
        raise PlanError("--compare-profile needs --compare-gpu")
    out = Path(args.output)
    from planner.outputs import check_output_folder
    check_output_folder(out, "-o", ("scaling.csv", "report.md", "throughput.png", "efficiency.png", "breakdown.png",
                                    "memory.png"), overwrite=args.force)
    from planner.model import resolve_model

    model = resolve_model(args.model)
    series_list = make_series(args, model)
    measured = load_validate_csv(args.validate_csv, model, args.gpus) if args.validate_csv else None

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    rows, plans = [], {}
    n0 = args.gpus[0]
    total = len(series_list) * len(args.gpus)
    with Progress(TextColumn("[bold]scaling[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=False) as prog:
        task = prog.add_task("", total=total)
        for s in series_list:
            for n in args.gpus:
                prog.update(task, description=f"{s.name}: {n} GPUs")
                row, plan = run_point(args, s, model, n, n0, args.top_k)
                rows.append(row)
                if plan is not None:
                    plans[(s.name, n)] = plan
                prog.advance(task)
    for r in rows:
        if r["status"] == "error":
            err.print(f"warning: {r['series']}, {r['gpus']} GPUs: {r['reason']}", style="yellow", markup=False)

    import pandas as pd

    from planner.cluster import GPU_KINDS

    df = pd.DataFrame(rows)
    for c in ("step_s", "tokens_per_s", "mfu", "nodes", "seq_len", "global_batch", "vpp"):
        if c not in df:
            df[c] = float("nan")
    for c in ("nodes", "global_batch", "seq_len", "tokens_per_step", "tp", "pp", "vpp", "dp", "cp", "ep",
              "micro_batch", "num_micro_batches"):
        if c in df:
            df[c] = df[c].astype("Int64")  # whole numbers stay whole beside the rows without a plan
    df = add_efficiency(df)
    df = attach_measured(df, measured, model, {k: v.peak_bf16_tflops for k, v in GPU_KINDS.items()})
    front = ["series", "gpu", "gpus", "nodes", "status", "reason", "global_batch", "seq_len", "tokens_per_step",
             "layout", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "num_micro_batches", "sharding",
             "recompute", "layers_per_rank", "step_s", "tokens_per_s", "ideal_tokens_per_s", "tokens_per_s_per_gpu",
             "tflops_per_gpu", "mfu", "efficiency", "mem_max_gib", "mem_limit_gib", "mem_headroom_gib",
             "mem_headroom_pct", "mem_per_rank_gib"]
    df = df[[c for c in front if c in df] + [c for c in df.columns if c not in front]]
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "scaling.csv", index=False)
    title = f"{model.name}, {'weak' if args.weak else 'strong'} scaling"
    write_plots(df, measured, out, title)
    elapsed = time.perf_counter() - t0
    write_report(df, measured, out, args, model, series_list, plans, argv, elapsed)
    print_summary(df, elapsed, out)
    return 0


def print_summary(df, elapsed: float, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for name, g in df.groupby("series", sort=False):
        t = Table(title=f"{name} ({elapsed:.1f} s)", title_justify="left")
        for c in ("GPUs", "layout", "step s", "tokens/s", "MFU", "eff.", "mem GiB"):
            t.add_column(c, justify="left" if c == "layout" else "right", no_wrap=True)
        for _, r in g.iterrows():
            if r["status"] != "ok":
                t.add_row(str(r["gpus"]), f"[red]{r['status']}[/] (see report.md)", "-", "-", "-", "-", "-")
                continue
            t.add_row(str(r["gpus"]), r["layout"], f"{r['step_s']:.3f}", f"{r['tokens_per_s']:,.0f}",
                      f"{r['mfu']:.1%}", f"{r['efficiency']:.2f}", f"{r['mem_max_gib']:.0f}/{r['mem_limit_gib']:.0f}")
        con.print(t)
    con.print(f"wrote {out / 'scaling.csv'}, throughput.png, efficiency.png, breakdown.png, memory.png, report.md")


if __name__ == "__main__":
    from planner.cli import main as cli_main
    sys.exit(cli_main(["scaling"] + sys.argv[1:]))
