"""`plan scaling`'s arguments and command: the points computed, then scaling.csv, the plots and report.md written
and a summary printed."""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from planner.errors import PlanError
from planner.scaling.output import write_plots, write_report
from planner.scaling.points import add_efficiency, attach_measured, load_validate_csv, make_series, run_point


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
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"--tokens must be a finite number, got '{s}'")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"--tokens must be positive, got '{s}'")
    return v


def build_parser() -> argparse.ArgumentParser:
    from planner.arguments import Parser, add_model_cluster_args, add_runtime_arg, positive_float, positive_int
    from planner.cluster import GPU_KINDS

    ap = Parser(prog="plan scaling", description="Strong or weak scaling report: the best plan at each GPU count, "
                 "with CSV, plots and a Markdown report.")
    add_model_cluster_args(ap, gpus_required=False)
    ap.add_argument("--gpus", type=_gpu_list, required=True, help="GPU counts, e.g. 8,16,32,64")
    ap.add_argument("--weak", action="store_true",
                    help="weak scaling: the batch per GPU stays fixed and the global batch grows with the GPUs")
    ap.add_argument("--batch-per-gpu", type=positive_float("--batch-per-gpu"),
                    help="sequences per GPU per step (the global batch is this times the GPU count); "
                         "excludes --global-batch")
    ap.add_argument("--tokens", type=_tokens, help="add the time and GPU-hours to train this many tokens (e.g. 2e12, 300B)")
    ap.add_argument("--compare-gpu", choices=sorted(k for k in GPU_KINDS if k != "cpu"),
                    help="what-if: a second series on this GPU kind")
    ap.add_argument("--compare-profile", help="profile JSON for --compare-gpu (default: the shipped one, else the "
                    "baseline profile rescaled by datasheet ratios)")
    ap.add_argument("--compare-inter-node-gbps", type=positive_float("--compare-inter-node-gbps"),
                    help="what-if: a second series with this network bandwidth per GPU (GB/s)")
    ap.add_argument("--validate-csv", help="results CSV of `plan validate`: overlay its measured points")
    ap.add_argument("--top-k", type=positive_int("--top-k"), default=DEFAULT_TOP_K,
                    help=f"plans kept per point by the search (default {DEFAULT_TOP_K}; only the best is reported)")
    add_runtime_arg(ap)
    ap.add_argument("--exact", action="store_true",
                    help="prove each point's best plan (plan --exact): every layout whose bound is below the best "
                         "evaluated")
    ap.add_argument("-o", "--output", required=True, help="folder for scaling.csv, the plots and report.md")
    ap.add_argument("--force", action="store_true", help="overwrite an existing DIR/scaling.csv")
    return ap


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
