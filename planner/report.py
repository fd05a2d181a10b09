"""Terminal and JSON output of a search: the best plan, why it wins, and the runners-up (rich tables)."""
from __future__ import annotations

import json

from planner.breakdown import BREAKDOWN_LABEL, BREAKDOWN_ORDER
from planner.legality import cuda_graph_violation
from planner.plan import Plan
from planner.search import SearchResult
from planner.search.result import PINNED_NOTE

HOST_PACED_SHARE = 0.10
"""A plan is host-paced when the host floor (issuing the kernels) sets at least this share of its predicted step.
Its time then depends on the CPU: the same host-paced 1-GPU plans measured on three hosts with the same GPU kind
spread 13-48%, GPU-paced ones 2-4% (benchmarks/results/README.md)."""


def host_paced(prediction) -> bool:
    """Whether the host floor sets at least HOST_PACED_SHARE of the predicted step."""
    return prediction.breakdown_s.get("host", 0.0) >= HOST_PACED_SHARE * prediction.step_s


def host_paced_note(prediction) -> str:
    """What `plan` and `plan validate` say of a host-paced prediction."""
    return (f"note: host-paced plan ({prediction.breakdown_s['host'] / prediction.step_s:.0%} of the predicted step "
            "waits for the host to issue kernels): its time depends on the CPU the profile's host figures came "
            "from, and on another machine it can differ by tens of percent (`python -m runtime.profiler.host` "
            "measures them on this machine)")


def _stage_summary(plan: Plan) -> str:
    """The layers of each pipeline rank, with its full (F) and selective (S) recompute layers; the first four and
    last two ranks where there are more than eight."""
    lay = plan.layout
    per_rank = []
    for r in range(lay.pp):
        js = plan.stages_of_rank(r)
        layers = sum(plan.stages[j].layers for j in js)
        full = sum(plan.stages[j].full_recompute_layers for j in js)
        sel = sum(plan.stages[j].selective_recompute_layers for j in js)
        rc = "/".join(x for x in (f"F{full}" if full else "", f"S{sel}" if sel else "") if x)
        per_rank.append(f"{layers}" + (f"({rc})" if rc else ""))
    if len(per_rank) > 8:
        return " ".join(per_rank[:4]) + " ... " + " ".join(per_rank[-2:])
    return " ".join(per_rank)


def _recompute_summary(plan: Plan) -> str:
    """The plan's recompute over all its layers: "none", or the selective and full layer counts."""
    full = sum(s.full_recompute_layers for s in plan.stages)
    sel = sum(s.selective_recompute_layers for s in plan.stages)
    n = plan.model.num_layers
    if not full and not sel:
        return "none"
    parts = []
    if sel:
        parts.append(f"selective {sel}/{n}")
    if full:
        parts.append(f"full {full}/{n}")
    return ", ".join(parts)


def print_result(result: SearchResult, elapsed_s: float, console=None, why_not: bool = False, target=None) -> None:
    """Print a search's result as `plan` shows it: the headline, the best plan's layout table, where its step goes,
    the best plans, the next best with more free memory, why not another kind of layout, and what was searched.

    Args:
        result: the search's result (plans best first).
        elapsed_s: how long the search took.
        console: a rich Console to print to (default: standard output, 140 columns wide when not a terminal).
        why_not: the alternatives were asked for (`plan --why-not`).
        target: the RuntimeTarget predicted for (its name is read from the plan when not given).
    """
    from rich.console import Console

    import sys

    # a pipe or a file gets a fixed width wide enough for the tables (rich would fold them at 80)
    con = console or (Console() if sys.stdout.isatty() else Console(width=140))
    best = result.plans[0]
    p = best.prediction
    _print_headline(con, result)
    con.print(_layout_table(result, target))
    con.print(memory_limit_line(best))
    con.print(_breakdown_table(p))
    if host_paced(p):
        con.print(host_paced_note(p), style="yellow")
    con.print(_best_plans_table(result))
    _print_next_best(con, result)
    _print_why_not(con, result, why_not)
    _print_search_summary(con, result, elapsed_s)


def _print_headline(con, result: SearchResult) -> None:
    """The model, cluster and batch the plans are for; the pinned-layout note when the layout was pinned."""
    best = result.plans[0]
    shape = best.training
    con.print(f"[bold]{best.model.name}[/] ({params_text(best.model)}) on "
              f"{best.cluster['num_gpus']} x {best.cluster['gpu']} ({best.cluster['gpus_per_node']} per node), "
              f"seq {shape.seq_len}, global batch {shape.global_batch} sequences "
              f"({shape.seq_len * shape.global_batch / 1e6:.2f}M tokens)")
    if result.pinned:
        con.print(PINNED_NOTE, style="bold")


def _layout_table(result: SearchResult, target=None):
    """The best plan as a two-column table: its runtime, layout, batch, sharding, stages, recompute, overlap, CUDA
    graph, step time, throughput and memory."""
    from rich.table import Table

    best = result.plans[0]
    p, lay = best.prediction, best.layout
    t = Table(title="Pinned layout" if result.pinned else "Recommended layout", show_header=False,
              title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("predicted for", _target_line(best, target))
    t.add_row("layout", f"{lay.short()}  (world {lay.world_size})")
    t.add_row("micro-batch", f"{lay.micro_batch} x {best.num_micro_batches} micro-batches per step"
              + (f", interleaved 1F1B with {lay.vpp} virtual stages" if lay.vpp > 1 else
                 (", 1F1B" if lay.pp > 1 else "")))
    t.add_row("data parallel", f"sharding: {lay.sharding}; main gradients and their reduction in {lay.grad_dtype}"
              + (", sequence parallel on" if lay.sequence_parallel else ""))
    t.add_row("layers per pipeline rank", _stage_summary(best))
    t.add_row("recompute", _recompute_summary(best))
    t.add_row("overlap", ", ".join(k for k, on in (("TP", lay.overlap_tp), ("DP", lay.overlap_dp), ("PP", lay.overlap_pp),
                                                         ("EP", lay.overlap_ep and lay.ep > 1)) if on) or "off")
    t.add_row("CUDA graph", "on: the step is captured once and replayed (no host time)" if lay.cuda_graph else
              f"off: {cuda_graph_violation(best.model, lay, best.cluster.get('gpu')) or 'not asked for'}")
    t.add_row("step time", f"{p.step_s:.3f} s")
    t.add_row("throughput", f"{p.tokens_per_s:,.0f} tokens/s, {p.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {p.mfu:.1%}")
    mems = p.memory_gib_per_rank
    t.add_row("memory per GPU", f"max {max(mems):.1f} GiB of {p.memory_limit_gib:.1f} GiB allowed"
              + (f" (ranks {min(mems):.1f}-{max(mems):.1f})" if len(mems) > 1 else ""))
    if 1 < len(mems) <= 16:
        t.add_row("memory per pipeline rank", " ".join(f"{x:.0f}" for x in mems) + " GiB")
    return t


def _breakdown_table(p):
    """Where the predicted step `p` goes on its slowest pipeline rank: each nonzero part's seconds and share."""
    from rich.table import Table

    b = Table(title="Where the step goes (slowest pipeline rank)", title_justify="left")
    b.add_column("part")
    b.add_column("seconds", justify="right")
    b.add_column("share", justify="right")
    for k in BREAKDOWN_ORDER:
        v = p.breakdown_s.get(k, 0.0)
        if v > 0:
            b.add_row(BREAKDOWN_LABEL[k], f"{v:.3f}", f"{v / p.step_s:.1%}")
    return b


def _best_plans_table(result: SearchResult):
    """The plans shown, one row each, with their step time against the best's."""
    from rich.table import Table

    p = result.plans[0].prediction
    r = Table(title="Best plans", title_justify="left")
    for col in ("#", "layout", "mb", "sharding", "recompute", "step s", "tokens/s", "TFLOP/s/GPU", "MFU", "mem GiB", "vs best"):
        r.add_column(col, justify="right" if col not in ("layout", "sharding", "recompute") else "left")
    for i, plan in enumerate(result.plans):
        q = plan.prediction
        r.add_row(str(i + 1), plan.layout.short(), str(plan.layout.micro_batch), plan.layout.sharding,
                  _recompute_summary(plan), f"{q.step_s:.3f}", f"{q.tokens_per_s:,.0f}", f"{q.tflops_per_gpu:.0f}",
                  f"{q.mfu:.1%}", f"{max(q.memory_gib_per_rank):.1f}", f"+{q.step_s / p.step_s - 1:.1%}" if i else "")
    return r


def _print_next_best(con, result: SearchResult) -> None:
    """The next best plan with more free memory (next_best_with_more_free), or that none of those shown has it."""
    p = result.plans[0].prediction
    roomier = next_best_with_more_free(result)
    if roomier is not None:
        q = roomier.prediction
        con.print(f"Next best with more free memory: {roomier.layout.short()} mb {roomier.layout.micro_batch}, "
                  f"recompute {_recompute_summary(roomier)}, max {max(q.memory_gib_per_rank):.1f} GiB, "
                  f"{q.step_s / p.step_s - 1:+.1%} step time")
    elif len(result.plans) > 1:
        con.print(f"no other plan of the {len(result.plans)} shown leaves {MORE_FREE_GIB:.0f} GiB or more free beyond "
                  "the best's (--top shows more)", style="dim")


def _print_why_not(con, result: SearchResult, why_not: bool) -> None:
    """The best plan of each other kind of layout and where it loses (`--why-not`), that there is none, or a hint
    that --why-not shows them."""
    from rich.table import Table

    p = result.plans[0].prediction
    if result.alternatives:
        w = Table(title="Why not another kind of layout (the best found of each)", title_justify="left")
        for col in ("instead", "its best layout", "mb", "sharding", "step s", "vs best", "where it loses"):
            w.add_column(col, justify="right" if col in ("mb", "step s", "vs best") else "left")
        for alt in result.alternatives:
            if alt.plan is None:
                w.add_row(alt.label, "-", "", "", "", "", alt.why)
                continue
            q = alt.plan.prediction
            w.add_row(alt.label, alt.plan.layout.short(), str(alt.plan.layout.micro_batch), alt.plan.layout.sharding,
                      f"{q.step_s:.3f}", f"{q.step_s / p.step_s - 1:+.1%}", alt.why)
        con.print(w)
    elif why_not:
        con.print("why not: no other kind of layout (TP degree, pipeline, sharding level, CP, EP) is legal here and "
                  "within the pins",
                  style="dim")
    else:
        con.print("why not TP 8, no pipeline, ZeRO-3, ...? --why-not shows the best plan of each other kind of layout "
                  "and where it loses time", style="dim")


def _print_search_summary(con, result: SearchResult, elapsed_s: float) -> None:
    """What the search looked at and how long it took, whether the best plan is proven, and where the times came
    from (the profile, what is modelled, the profile's warnings)."""
    st = result.stats
    con.print(f"searched {st.layouts_enumerated} layouts ({st.layouts_bounded} bounded beyond their compute, {st.layouts_fit_bound} of "
              f"those within the memory bound), "
              f"{st.layouts_greedy} split greedily, {st.layouts_solved} by CP-SAT ({st.proven_optimal} proven optimal); "
              f"{elapsed_s:.2f} s")
    con.print(f"best plan: {st.optimality}", style=None if st.optimality == "proven" else "yellow")
    prov = result.plans[0].provenance
    con.print(f"times from profile {prov.get('profile')} ({prov.get('profile_kind')}); modelled: "
              + "; ".join(prov.get("modelled", [])), style="dim")
    for w in prov.get("profile_warnings", []):
        con.print(f"profile warning: {w}", style="yellow")


MORE_FREE_GIB = 1.0
"""How much less memory the busiest rank of a runner-up must hold to be named as the next best with more free."""


def next_best_with_more_free(result: SearchResult) -> Plan | None:
    """The fastest runner-up whose busiest rank holds at least MORE_FREE_GIB less than the best plan's."""
    most = max(result.plans[0].prediction.memory_gib_per_rank)
    for plan in result.plans[1:]:
        if max(plan.prediction.memory_gib_per_rank) <= most - MORE_FREE_GIB:
            return plan
    return None


def memory_limit_line(plan: Plan) -> str:
    """How the plan's memory limit came about: the planner's allowance less the headroom (planner/cluster.py)."""
    from planner.cluster import DEFAULT_HEADROOM_SHARE, GPU_KINDS

    limit, headroom = plan.prediction.memory_limit_gib, plan.cluster.get("memory_headroom_gib") or 0.0
    hbm = GPU_KINDS[plan.cluster["gpu"]].memory_gib
    why = f"{DEFAULT_HEADROOM_SHARE:.0%} of HBM, --headroom-gib to change" \
        if abs(headroom - DEFAULT_HEADROOM_SHARE * hbm) < 1e-9 else "--headroom-gib"
    return f"memory limit {limit:.1f} GiB = {limit + headroom:.1f} GiB allowance - {headroom:.1f} GiB headroom ({why})"


def _target_line(plan: Plan, target=None) -> str:
    """The runtime a plan's prediction is for, in words (planner/cost/targets.py)."""
    from planner.cost.targets import load_target

    return (target or load_target(plan.runtime)).describe()


def params_text(model) -> str:
    """Total parameters, and for an MoE model the active ones (what one token passes through)."""
    if model.is_moe:
        return f"{model.total_params() / 1e9:.1f}B params, {model.active_params() / 1e9:.1f}B active"
    return f"{model.total_params() / 1e9:.1f}B params"


def result_json(result: SearchResult, elapsed_s: float, target=None) -> str:
    """A search's result as `plan --json` prints it: the plans, the search's statistics and the alternatives."""
    st = result.stats
    roomier = next_best_with_more_free(result)
    model = result.plans[0].model
    return json.dumps({
        "runtime": result.plans[0].runtime,
        "runtime_description": _target_line(result.plans[0], target),
        "model_params": {"total": model.total_params(), "active": model.active_params()},
        "pinned": result.pinned,
        "pinned_note": PINNED_NOTE if result.pinned else None,
        "plans": [p.to_dict() for p in result.plans],
        "next_best_with_more_free_memory": result.plans.index(roomier) if roomier is not None else None,
        "search": {"layouts_enumerated": st.layouts_enumerated, "layouts_legal": st.layouts_legal,
                   "layouts_bounded": st.layouts_bounded, "layouts_within_memory_bound": st.layouts_fit_bound, "layouts_greedy": st.layouts_greedy,
                   "layouts_cpsat": st.layouts_solved, "cpsat_proven_optimal": st.proven_optimal,
                   "exact": st.exact, "optimality": st.optimality, "first_split_proven": st.first_split_proven,
                   "unevaluated_below_best": st.unevaluated_below_best,
                   "phase_s": st.phase_s, "elapsed_s": elapsed_s},
        "alternatives": [{"instead": a.label, "plan": a.plan.to_dict() if a.plan else None,
                          "vs_best": a.plan.prediction.step_s / result.plans[0].prediction.step_s - 1 if a.plan else None,
                          "why": a.why} for a in result.alternatives],
    }, indent=2)
