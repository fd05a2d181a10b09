"""What a scaling report writes: the plots (throughput, efficiency, breakdown, memory) and report.md."""
from __future__ import annotations

import json
import math
from pathlib import Path

from planner.scaling.points import _layers_per_rank, _recompute_label


# -- plots ------------------------------------------------------------------------------------------------

SERIES_STYLES = ["o-", "s--", "^-.", "d:"]
"""Matplotlib line styles of the series, in order; the plots draw the first four series."""


def write_plots(df, measured, out: Path, title: str) -> list[str]:
    """Draw the four plots of a scaling report into `out`: throughput, efficiency (and MFU), breakdown, memory.

    Args:
        df: the scaling table (one row per series and GPU count, as scaling.csv).
        measured: the measured points of `plan validate` to overlay, or None.
        out: the report's folder.
        title: what the throughput plot is of.

    Returns:
        The file names written, in that order.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(df["series"]))
    gpus = sorted(df["gpus"].unique())
    return [_throughput_plot(plt, df, measured, out, title, series, gpus),
            _efficiency_plot(plt, df, out, series, gpus),
            _breakdown_plot(plt, df, out, series),
            _memory_plot(plt, df, out, series, gpus)]


def _gpu_axis(ax, gpus) -> None:
    """A log2 x axis of GPU counts, ticked at each count of the report (spanning them when nothing is drawn: no
    point has a plan)."""
    if not math.isfinite(ax.dataLim.minposx):  # no point drawn: autoscaling would give a log axis no range
        ax.set_xlim(min(gpus) / 2, max(gpus) * 2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus)
    ax.set_xticklabels([str(g) for g in gpus])
    ax.set_xlabel("GPUs")
    ax.grid(True, which="both", alpha=0.3)


def _save(plt, fig, out: Path, name: str) -> str:
    """Lay out, write as `out`/`name` (120 dpi) and close a figure; returns `name`."""
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return name


def _throughput_plot(plt, df, measured, out: Path, title: str, series: list, gpus) -> str:
    """Predicted tokens/s against GPUs per series, with the ideal line, the points without a plan and the
    measured points."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s, st in zip(series, SERIES_STYLES):
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
    _gpu_axis(ax, gpus)
    if math.isfinite(ax.dataLim.minposy):  # a log axis needs a positive value: none when no point has a plan
        ax.set_yscale("log")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"Throughput: {title}", fontsize=10)
    ax.legend(fontsize=7)
    return _save(plt, fig, out, "throughput.png")


def _efficiency_plot(plt, df, out: Path, series: list, gpus) -> str:
    """MFU (with the measured MFU) and scaling efficiency against GPUs, side by side."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for s, st in zip(series, SERIES_STYLES):
        ok = df[(df["series"] == s) & (df["status"] == "ok")]
        a1.plot(ok["gpus"], ok["mfu"] * 100, st, label=s)
        a2.plot(ok["gpus"], ok["efficiency"] * 100, st, label=s)
    if "measured_mfu" in df and df["measured_mfu"].notna().any():
        mm = df[df["measured_mfu"].notna()]
        a1.plot(mm["gpus"], mm["measured_mfu"] * 100, "kx", ms=9, mew=2, label="measured")
    for a, lab in ((a1, "MFU (%)"), (a2, "scaling efficiency (%)")):
        _gpu_axis(a, gpus)
        a.set_ylabel(lab)
        a.set_ylim(bottom=0)
        a.legend(fontsize=7)
    a2.axhline(100, color="grey", lw=0.8, ls=":")
    a1.set_title("Model FLOPs utilisation", fontsize=10)
    a2.set_title("Tokens/s per GPU against the first point", fontsize=10)
    return _save(plt, fig, out, "efficiency.png")


def _breakdown_plot(plt, df, out: Path, series: list) -> str:
    """The step's breakdown as stacked shares per GPU count, one panel per series, each bar labelled with the
    step time."""
    from planner.breakdown import BREAKDOWN_LABEL, BREAKDOWN_ORDER

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
        if ax.get_legend_handles_labels()[0]:  # no bars when the series has no plan
            ax.legend(fontsize=7, loc="lower left")
    return _save(plt, fig, out, "breakdown.png")


def _memory_plot(plt, df, out: Path, series: list, gpus) -> str:
    """Predicted peak memory of every pipeline rank and of the busiest against the planner's limit, per series,
    with the measured peaks."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s, st in zip(series, SERIES_STYLES):
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
    _gpu_axis(ax, gpus)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("predicted peak memory (GiB)")
    ax.set_title("Memory per pipeline rank against the planner's limit", fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # nothing drawn when no point has a plan
        ax.legend(fontsize=7)
    return _save(plt, fig, out, "memory.png")


# -- report -----------------------------------------------------------------------------------------------

def _fmt(v, spec):
    """`v` formatted with `spec`; "-" for a missing value (None, NaN), str(v) where the spec does not apply."""
    try:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def write_report(df, measured, out: Path, args, model, series_list, plans, argv, elapsed_s: float) -> None:
    """Write `out`/report.md: the header, a section per series, the efficiency, breakdown and memory sections, the
    plan at each point, the measured points, the provenance of the figures and the points without a plan.

    Args:
        df: the scaling table (one row per series and GPU count, as scaling.csv).
        measured: the measured points of `plan validate` (None: no --validate-csv given).
        out: the report's folder (its plots are written beside by write_plots).
        args: `plan scaling`'s parsed arguments.
        model: the ModelSpec scaled.
        series_list: the series, the first being the base whose plans are listed.
        plans: {(series name, GPU count): Plan} of the points with a plan.
        argv: `plan scaling`'s command line, quoted in the header.
        elapsed_s: how long the searches took.
    """
    base = series_list[0]
    gbs = sorted(set(int(x) for x in df["global_batch"].dropna()))
    lines = _report_header(df, args, model, gbs, argv, elapsed_s)
    for s in series_list:
        lines += _series_section(df[df["series"] == s.name], s, args)
    lines += _breakdown_section(df, df[(df["series"] == base.name) & (df["status"] == "ok")])
    lines += ["## Memory", "", "Predicted peak allocated memory of every pipeline rank against what the planner "
              "allows per GPU (capacity less the reserve and fragmentation margin).", "", "![memory](memory.png)", ""]
    lines += _plans_section(plans, base.name)
    lines += _measured_section(measured, args, model, gbs)
    lines += _provenance_section(df, series_list)
    lines += _points_without_plan(df)
    lines.append("")
    lines.append("Files: `scaling.csv` (one row per series and GPU count; `t_*_s` columns are the breakdown in seconds), "
                 "`throughput.png`, `efficiency.png`, `breakdown.png`, `memory.png`.")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def _report_header(df, args, model, gbs: list[int], argv, elapsed_s: float) -> list[str]:
    """The title, the command, the runtime, the model and cluster, the batch (strong or weak scaling), the search
    time and the throughput plot. `gbs`: the global batches of the report's points, ascending."""
    from planner.cost.targets import load_target

    mode = "weak" if args.weak else "strong"
    lines = [f"# Scaling report: {model.name}, {mode} scaling", ""]
    lines.append(f"`plan scaling {' '.join(argv)}`  ")
    lines.append(f"Predicted for the runtime {load_target(getattr(args, 'runtime', 'ours')).describe()}.  ")
    lines.append(f"{model.name}: {model.total_params() / 1e9:.1f}B parameters, {model.num_layers} layers, hidden "
                 f"{model.hidden}. GPU counts {', '.join(str(g) for g in sorted(df['gpus'].unique()))}; "
                 f"{args.gpus_per_node} GPUs per node; network {args.inter_node_gbps:g} GB/s per GPU.  ")
    seq = int(df["seq_len"].dropna().iloc[0]) if df["seq_len"].notna().any() else model.default_seq_len
    if args.weak:  # no global batch when no point has a whole one
        lines.append(f"Weak scaling: the batch per GPU is fixed, the global batch grows from "
                     f"{gbs[0] if gbs else '?'} to {gbs[-1] if gbs else '?'} sequences of {seq} tokens.  ")
    else:
        lines.append(f"Strong scaling: a fixed global batch of {gbs[0] if gbs else '?'} sequences of {seq} tokens "
                     f"({(gbs[0] if gbs else 0) * seq / 1e6:.2f}M tokens per step).  ")
    lines.append(f"Searched in {elapsed_s:.1f} s. Scaling efficiency is tokens/s per GPU over that of the first GPU "
                 "count with a plan (1.0 is perfect scaling).")
    lines.append("")
    lines.append("![throughput](throughput.png)")
    lines.append("")
    return lines


def _series_section(g, s, args) -> list[str]:
    """One series' section: its notes, its table (a row per GPU count; days and GPU-hours with --tokens) and, with
    two points or more, how its throughput and efficiency grow and what takes the step at the largest count.
    `g`: the series' rows of the scaling table."""
    from planner.breakdown import BREAKDOWN_LABEL, BREAKDOWN_ORDER

    lines = [f"## {s.name}"]
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
    return lines


def _breakdown_section(df, first_ok) -> list[str]:
    """The efficiency and breakdown plots, and a table of the breakdown in seconds of the base series' points
    (`first_ok`: its rows with a plan) over the parts that any point has."""
    from planner.breakdown import BREAKDOWN_LABEL, BREAKDOWN_ORDER

    lines = ["## Efficiency and MFU", "", "![efficiency](efficiency.png)", "",
             "## Where the time goes", "",
             "Share of the predicted step (slowest pipeline rank) per part; the label over each bar is the step time.",
             "", "![breakdown](breakdown.png)", ""]
    bcols = [k for k in BREAKDOWN_ORDER if f"t_{k}_s" in df and (df[f"t_{k}_s"] > 0).any()]
    if bcols and not first_ok.empty:
        lines.append("| GPUs | " + " | ".join(BREAKDOWN_LABEL[k] for k in bcols) + " |")
        lines.append("|---|" + "---|" * len(bcols))
        for _, r in first_ok.iterrows():
            lines.append(f"| {r['gpus']} | " + " | ".join(f"{r[f't_{k}_s']:.3f}" for k in bcols) + " |")
        lines.append("")
    return lines


def _plans_section(plans, base_name: str) -> list[str]:
    """The base series' plan at each GPU count in one line each, and how to write one as a plan file."""
    lines = ["## The plan at each point", ""]
    for (sname, n), plan in plans.items():
        if sname != base_name:
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
    return lines


def _measured_section(measured, args, model, gbs: list[int]) -> list[str]:
    """The measured points overlaid on the plots, as a table against their predictions (or why there are none).
    `gbs`: the report's global batches, to flag measured runs of another batch in strong scaling."""
    lines = ["## Measured points", ""]
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
    return lines


def _provenance_section(df, series_list) -> list[str]:
    """What the predictions rest on: each series' profile and its measured and modelled parts, the modelled
    network of multi-node points and the memory model's allowances."""
    from planner import memory as mem

    lines = ["## Provenance of the figures", ""]
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
    lines.append(f"- Memory: counted per tensor; allowance {mem.RESERVED_GIB} GiB outside the allocator and "
                 f"{mem.FRAGMENTATION:.0%} fragmentation (modelled).")
    return lines


def _points_without_plan(df) -> list[str]:
    """The points without a plan and why, as a section of their own (nothing when every point has one)."""
    lines = []
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        lines.append("")
        lines.append("## Points without a plan")
        lines.append("")
        for _, r in bad.iterrows():
            lines.append(f"- {r['series']}, {r['gpus']} GPUs ({r['status']}): {r['reason']}")
    return lines


def _isnan(v) -> bool:
    """Whether `v` is a number that is NaN (False for anything that is not a number)."""
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False
