"""The points of a scaling report: the series (the baseline and each what-if), the best plan at each GPU count,
scaling efficiency, and the measured points of `plan validate` beside them."""
from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import dataclass, field, replace

from planner.errors import PlanError


VALIDATE_COLUMNS = ("model", "gpus", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch", "seq_len",
                    "recompute", "predicted_step_s", "measured_step_s", "predicted_mem_gib", "measured_mem_gib",
                    "gpu", "profile", "commit", "date")


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
    from planner.arguments import resolve_inputs
    from planner.breakdown import BREAKDOWN_ORDER
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
        from planner.cost.targets import load_target

        result = search(m, shape, cluster, series.profile, Pins(), top_k=top_k,
                        target=load_target(getattr(args, "runtime", "ours")), exact=getattr(args, "exact", False))
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
    row.update(status="ok", reason="", runtime=plan.runtime, layout=lay.short(), tp=lay.tp, pp=lay.pp, vpp=lay.vpp, dp=lay.dp, cp=lay.cp,
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


def make_series(args, model) -> list[Series]:
    from planner.arguments import check_flags_beside_cluster
    from planner.cluster import load_cluster_file
    from planner.profile import load_profile, shipped_profile_path

    gpu = args.gpu
    inter = args.inter_node_gbps
    if args.cluster:
        c = load_cluster_file(args.cluster)
        check_flags_beside_cluster(args, c)
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
