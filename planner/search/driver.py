"""The branch-and-bound driver: enumerate and bound the layouts, evaluate exactly (CP-SAT's split and the greedy one,
played) every layout whose bound is below the best plan found, then the runners-up; and say in one sentence why
nothing fits when nothing does."""
from __future__ import annotations

import heapq
import math
import time

from planner import memory as mem
from planner.bounds import compute_bound_s, time_and_memory_bounds
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.errors import NoFitError, PlanError
from planner.legality import layout_violation
from planner.model import ModelSpec
from planner.plan import Layout, Plan, StagePlan, TrainingShape
from planner.profile import Profile
from planner.search.alternatives import _alternatives
from planner.search.layouts import enumerate_layouts
from planner.search.result import Pins, SearchResult, SearchStats
from planner.search.scoring import _Candidate, _plan_of
from planner.search.stages import SOLVE_WORK, _solve_concurrently, greedy_stages


EXACT_TOLERANCE = 1e-12
"""A layout whose lower bound exceeds the best plan's step by no more than this share is still evaluated: a bound
equal to the best step could be a tie, and ties go to the first layout in layout_order."""


def _cheaper_dispatch(cm: CostModel, model, shape, cluster, profile, shared) -> CostModel:
    """The layout's MoE dispatch, at once or in two overlapped chunks (Layout.overlap_ep), whichever costs a
    layer less: smaller expert GEMMs and one more round of host work against hidden all-to-alls. Only the MoE
    layer differs between the two, so the choice needs no search of its own."""
    lay = cm.lay
    # the choice depends only on what prices the MoE layer (the layer memo's key, which holds the dispatch chunks):
    # decided once per such key and search
    key = ("cheaper dispatch",) + cm.layer_key
    flip = shared.get(key)
    if flip is False:
        return cm
    cm2 = CostModel(model, shape, Layout(**{**lay.__dict__, "overlap_ep": not lay.overlap_ep}), cluster, profile,
                    shared)
    if flip is None:
        one_layer = StagePlan(1)

        def layer_s(c):
            return c.layer.fwd_bwd_s + c.stage_expert_host_s(one_layer)

        flip = shared[key] = layer_s(cm2) < layer_s(cm)
    return cm2 if flip else cm


def layout_order(lay: Layout) -> tuple:
    """How plans of equal step time are ordered (the fewest GPUs per model replica first, then the degrees), so that
    the first plan is one and the same whatever else the search evaluates."""
    return (lay.tp * lay.pp * lay.cp, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.micro_batch, repr(lay))


def search(model: ModelSpec, shape: TrainingShape, cluster: ClusterSpec, profile: Profile,
           pins: Pins = Pins(), top_k: int = 4, solve_work: float = SOLVE_WORK,
           progress=None, alternatives: bool = False) -> SearchResult:
    """Best plans first; the first is the best plan of every legal layout, whatever top_k and alternatives are.

    Every legal layout gets a cheap lower bound of its step (its layers' compute), and in the order of the bounds
    its full bounds (memory; time with communication, optimizer and the least recompute fitting takes), each a
    lower bound of the step the schedule played gives any split of it (planner/bounds.py). In that order each
    layout whose bound is below the best plan found so far is evaluated exactly: its greedy split, CP-SAT's split
    hinted with it (`solve_work` of deterministic time), both played, the faster kept; the search stops at the
    first bound above the best step. That is the first plan: a layout is passed over only when a bound proves it
    no faster. The runners-up (top_k - 1 of them) come after: the layouts next in bound order, scored by their
    greedy splits played, until the next bound exceeds the top_k-th step; those shown get CP-SAT's split where it
    plays faster. alternatives: also the best plan of each kind of layout the first plan is not
    (planner/search/alternatives.py), from the same candidates."""
    stats = SearchStats()
    t0 = time.perf_counter()
    limit = mem.plan_memory_limit_bytes(cluster)
    candidates: list[_Candidate] = []
    shared: dict = {}
    first_violation = None
    for lay in enumerate_layouts(model, shape, cluster, pins):
        stats.layouts_enumerated += 1
        why = layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node)
        if why:
            first_violation = first_violation or (lay, why)
            continue
        stats.layouts_legal += 1
        cm = CostModel(model, shape, lay, cluster, profile, shared)
        if lay.ep > 1 and "ep" not in pins.no_overlap:
            cm = _cheaper_dispatch(cm, model, shape, cluster, profile, shared)
            lay = cm.lay
        candidates.append(_Candidate(lay, cm, compute_bound_s(cm, shape, pins.recompute)))
    stats.phase_s["enumerate_and_bound"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    queue = [(c.compute_bound_s, i, False) for i, c in enumerate(candidates)]
    heapq.heapify(queue)
    min_mem: list = []
    exact: list[tuple[float, tuple, _Candidate, list[StagePlan]]] = []  # (step, order, candidate, stages)
    threads = _threads()
    while True:
        best = exact[0][0] if exact else math.inf
        batch = _next_bounded(queue, candidates, best, shape, pins, limit, stats, min_mem, threads)
        if not batch:
            break
        for c, (step, stages) in zip(batch, _evaluate_exactly(batch, shape, limit, pins.recompute, solve_work, stats)):
            if stages is not None:
                exact.append((step, layout_order(c.layout), c, stages))
        exact.sort(key=lambda x: x[:2])
    stats.phase_s["exact"] = time.perf_counter() - t1
    if not exact:
        raise _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem and min(min_mem)[::2], limit)

    t2 = time.perf_counter()
    ranked = list(exact)
    while top_k > 1:  # the runners-up: greedy splits played, in bound order, while a bound is below the k-th step
        kth = ranked[top_k - 1][0] if len(ranked) >= top_k else math.inf
        batch = _next_bounded(queue, candidates, kth, shape, pins, limit, stats, min_mem, 1)
        if not batch:
            break
        c = batch[0]
        if not c.greedy_tried:
            c.greedy, c.greedy_tried = greedy_stages(c.cost, shape, limit, pins.recompute), True
            stats.layouts_greedy += 1
        if c.greedy is not None:
            ranked.append((c.cost.predict(c.greedy).step_s, layout_order(c.layout), c, c.greedy))
            ranked.sort(key=lambda x: x[:2])
    shown = ranked[:top_k]
    unsolved = [(c, stages) for step, _, c, stages in shown if all(c is not e[2] for e in exact)]
    better = _solve_concurrently([(c.cost, stages) for c, stages in unsolved], shape, limit, pins.recompute,
                                 solve_work) if unsolved else []
    stats.layouts_solved += len(unsolved)
    refined = {}
    for (c, stages), res in zip(unsolved, better):
        if res.stages is not None:
            step = c.cost.predict(res.stages).step_s
            if step < c.cost.predict(stages).step_s:
                refined[id(c)] = (step, res.stages)
    shown = sorted(((*refined.get(id(c), (step, stages)), order, c) for step, order, c, stages in shown),
                   key=lambda x: (x[0], x[2]))
    plans = [_plan_of(c, stages, c.cost.predict(stages), model, shape, cluster, profile) for _, stages, _, c in shown]
    stats.phase_s["runners_up"] = time.perf_counter() - t2
    stats.gap_to_bound = 0.0  # every layout passed over has a bound at or above the first plan's step
    result = SearchResult(plans=plans, stats=stats, pinned=pins.every_dimension(model) and stats.layouts_legal == 1)
    if alternatives:
        t3 = time.perf_counter()
        result.alternatives = _alternatives(plans, candidates, model, shape, cluster, profile, pins, limit)
        stats.phase_s["alternatives"] = time.perf_counter() - t3
    return result


def _threads() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _next_bounded(queue, candidates, below_s, shape, pins, limit, stats, min_mem, most: int) -> list[_Candidate]:
    """Up to `most` candidates off the queue, in the order of their full time bounds, whose full bound is within
    EXACT_TOLERANCE of below_s or under it (a candidate known by its compute bound alone gets its full bounds and
    goes back in line; one whose memory bound exceeds the limit leaves it). Empty when the next bound is above."""
    out = []
    while queue and len(out) < most:
        bound_s, i, bounded = queue[0]
        if bound_s > below_s * (1 + EXACT_TOLERANCE):
            break
        heapq.heappop(queue)
        c = candidates[i]
        if bounded:
            out.append(c)
            continue
        if math.isnan(c.time_bound_s):
            c.time_bound_s, c.memory_bound_bytes = time_and_memory_bounds(c.cost, shape, pins.recompute, limit)
            stats.layouts_bounded += 1
            stats.layouts_fit_bound += c.memory_bound_bytes <= limit
        min_mem.append((c.memory_bound_bytes, layout_order(c.layout), c.layout))
        if c.memory_bound_bytes <= limit:
            heapq.heappush(queue, (c.time_bound_s, i, True))
    return out


def _evaluate_exactly(batch: list[_Candidate], shape, limit, recompute, solve_work, stats) -> list[tuple]:
    """(step, stages) of each candidate: its greedy split and CP-SAT's split hinted with it, both played, the faster
    (the greedy one on a tie); (inf, None) when neither fits. A function of the candidate alone, so the first plan
    does not depend on which other layouts a search evaluates."""
    for c in batch:
        if not c.greedy_tried:
            c.greedy, c.greedy_tried = greedy_stages(c.cost, shape, limit, recompute), True
            stats.layouts_greedy += 1
    solved = _solve_concurrently([(c.cost, c.greedy) for c in batch], shape, limit, recompute, solve_work)
    out = []
    for c, res in zip(batch, solved):
        stats.layouts_solved += 1
        stats.cpsat_variables += 3 * c.layout.num_virtual_stages
        stats.proven_optimal += int(res.proven_optimal)
        best = (math.inf, None)
        for stages in (c.greedy, res.stages):
            if stages is not None:
                pred = c.cost.predict(stages)
                if max(pred.memory_gib_per_rank) * mem.GIB > limit * (1 + 1e-9):
                    continue  # the solver rounds memory up and never allows this; kept as a guard
                if pred.step_s < best[0]:
                    best = (pred.step_s, stages)
        out.append(best)
    return out


def _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem, limit) -> PlanError:
    if stats.layouts_legal == 0:
        if first_violation:
            lay, why = first_violation
            return PlanError(f"no legal layout of {model.name} on {cluster.num_gpus} GPUs"
                             f"{' with the given pins' if pins != Pins() else ''}: {why}")
        pinned = {k: getattr(pins, k) for k in ("tp", "pp", "dp", "cp") if getattr(pins, k)}
        product = 1
        for v in pinned.values():
            product *= v
        if pinned and cluster.num_gpus % product:
            what = " x ".join(f"{k.upper()} {v}" for k, v in pinned.items())
            return PlanError(f"the pinned degrees ({what} = {product}) do not divide {cluster.num_gpus} GPUs")
        if pins.tp and pins.tp > cluster.gpus_per_node:
            return PlanError(f"TP {pins.tp} would span nodes of {cluster.gpus_per_node} GPUs")
        return PlanError(f"no layout of {model.name} exists on {cluster.num_gpus} GPUs with the given pins")
    need_gib = min_mem[0] / mem.GIB if min_mem else float("nan")
    fewest = _fewest_gpus_that_fit(model, shape, cluster, profile, pins, limit)
    where = f"; it needs at least {fewest} GPUs" if fewest else ""
    return NoFitError(
        f"no layout of {model.name} fits in memory on {cluster.num_gpus} {cluster.gpu} GPUs: the binding "
        f"constraint is per-GPU memory, every layout needs at least {need_gib:.1f} GiB per GPU "
        f"(least: {min_mem[1].short()} with full recompute) against the {limit / mem.GIB:.1f} GiB allowed{where}")


def _fewest_gpus_that_fit(model, shape, cluster, profile, pins, limit) -> int | None:
    from dataclasses import replace

    n = cluster.num_gpus
    for _ in range(12):
        n *= 2
        c2 = replace(cluster, num_gpus=n)
        for lay in enumerate_layouts(model, shape, c2, Pins(**{**pins.__dict__, "dp": None})):
            if layout_violation(model, shape, lay, n, c2.gpus_per_node):
                continue
            _, m_lb = time_and_memory_bounds(CostModel(model, shape, lay, c2, profile), shape, pins.recompute)
            if m_lb <= limit:
                return n
    return None
