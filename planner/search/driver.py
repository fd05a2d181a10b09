"""The search driver: enumerate and bound the layouts; evaluate exactly (CP-SAT's split and the greedy one, played)
the LEADERS layouts the score ranks first (default) or every layout whose bound is below the best plan found
(exact=True, branch and bound); then the runners-up; and say in one sentence why nothing fits when nothing does."""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace

from planner import memory as mem
from planner.bounds import compute_bound_s, memory_bound_bytes
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.cost.targets import OURS, RuntimeTarget
from planner.errors import NoFitError, PlanError
from planner.legality import layout_violation
from planner.model import ModelSpec
from planner.plan import Layout, StagePlan, TrainingShape
from planner.profile import Profile
from planner.search.alternatives import _alternatives
from planner.search.layouts import enumerate_layouts
from planner.search.result import Pins, SearchResult, SearchStats
from planner.search.scoring import _bound_fully, _Candidate, _plan_of, _score
from planner.search.stages import (ENUMERATE_CHOICES, FIRST_SOLVE_WORK, SOLVE_WORK, _solve_concurrently,
                                    count_stage_choices, enumerate_stages, greedy_stages)


EXACT_TOLERANCE = 1e-12
"""A layout whose lower bound exceeds the best plan's step by no more than this share is still evaluated: a bound
equal to the best step could be a tie, and ties go to the first layout in layout_order."""


def _cheaper_dispatch(cm: CostModel, model, shape, cluster, profile, shared) -> CostModel:
    """The layout's MoE dispatch overlapped or not (Layout.overlap_ep: ours in two chunks, Megatron's beside the other
    micro-batch's layer), whichever costs a layer less: for ours, smaller expert GEMMs and one more round of host
    work against hidden all-to-alls. Only the MoE
    layer differs between the two, so the choice needs no search of its own."""
    lay = cm.lay
    # the choice depends only on what prices the MoE layer (the layer memo's key, which holds the dispatch chunks):
    # decided once per such key and search
    key = ("cheaper dispatch",) + cm.layer_key
    flip = shared.get(key)
    if flip is False:
        return cm
    cm2 = CostModel(model, shape, Layout(**{**lay.__dict__, "overlap_ep": not lay.overlap_ep}), cluster, profile,
                    shared, cm.target)
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


LEADERS = 16
"""The default search (search(exact=False)) evaluates exactly the LEADERS layouts its score ranks first (greedy splits
scored by the schedule's closed form, in the order of the bounds; scoring._score) and takes the best of them: a set
that does not depend on top_k, alternatives or the entry point, so neither does the first plan. Whether that plan is
proven the best of every layout is counted and reported (SearchStats.unevaluated_below_best)."""


def search(model: ModelSpec, shape: TrainingShape, cluster: ClusterSpec, profile: Profile,
           pins: Pins = Pins(), top_k: int = 4, solve_work: float = SOLVE_WORK,
           progress=None, alternatives: bool = False, exact: bool = False, target: RuntimeTarget = OURS) -> SearchResult:
    """Best plans first; the first does not depend on top_k or alternatives.

    Every legal layout gets a cheap lower bound of its step (its layers' compute), and in the order of the bounds
    its full bounds (memory; time with communication, optimizer and the least recompute fitting takes), each a
    lower bound of the step the schedule played gives any split of it (planner/bounds.py). A layout evaluated
    exactly gets its greedy split and CP-SAT's split hinted with it (`solve_work` of deterministic time), both
    played, the faster kept; one of at most stages.ENUMERATE_CHOICES (split x recompute) choices plays them all.

    exact=False (the default): the LEADERS layouts the score ranks first are evaluated exactly, the first plan is
    the best of them; the layouts not evaluated whose bound is below its step are counted (stats.
    unevaluated_below_best: 0 proves it the best of every layout). exact=True: in bound order each layout whose
    bound is below the best plan found so far is evaluated exactly, until the first bound above the best step:
    the first plan is the best of every layout (proven). The runners-up (top_k - 1 of them) come after: the
    evaluated layouts, then the layouts next in bound order scored by their greedy splits played, until the next
    bound exceeds the top_k-th step; those shown get CP-SAT's split where it plays faster. They never displace the
    first plan. alternatives: also the best plan of each kind of layout the first plan is not
    (planner/search/alternatives.py), from the same candidates. target: the runtime predicted for
    (planner/cost/targets.py); one that cannot capture CUDA graphs plans eagerly."""
    if not target.cuda_graph and pins.cuda_graph:
        pins = replace(pins, cuda_graph=False)
    stats = SearchStats(exact=exact)
    limit = mem.plan_memory_limit_bytes(cluster)
    candidates, first_violation = _bounded_candidates(model, shape, cluster, profile, pins, target, stats)
    t1 = time.perf_counter()
    if exact:
        evaluated, least = _exact_first(candidates, shape, pins, limit, solve_work, stats)
    else:
        evaluated, least = _leaders_first(candidates, shape, pins, limit, solve_work, stats)
    stats.phase_s["exact" if exact else "leaders"] = time.perf_counter() - t1
    if not evaluated:
        raise _no_fit(model, shape, cluster, profile, pins, stats, first_violation, least, limit, target)
    if stats.layouts_legal <= LEADERS:  # a narrow search (pins): one more solve is affordable
        evaluated[0] = _first_split_refined(evaluated[0], shape, limit, pins.recompute, stats)
    else:
        stats.first_split_proven = evaluated[0][2].split_proven
    best_s = evaluated[0][0]
    done = {id(e[2]) for e in evaluated}
    t2 = time.perf_counter()
    lowest_unevaluated_s = math.inf
    if not exact:
        stats.unevaluated_below_best, lowest_unevaluated_s = _count_unevaluated_below(candidates, done, best_s, shape,
                                                                                      pins, limit, stats)
    stats.phase_s["optimality"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    first = evaluated[0]
    rest = _runners_up(candidates, list(evaluated[1:]), done, top_k, shape, pins, limit, solve_work, stats)
    shown = [(first[0], first[3], first[1], first[2])] + rest
    stats.faster_runner_up = any(step < first[0] for step, *_ in rest)
    plans = [_plan_of(c, stages, c.play(stages), model, shape, cluster, profile) for _, stages, _, c in shown]
    stats.phase_s["runners_up"] = time.perf_counter() - t3
    stats.gap_to_bound = max(0.0, first[0] / lowest_unevaluated_s - 1)
    result = SearchResult(plans=plans, stats=stats, pinned=pins.every_dimension(model) and stats.layouts_legal == 1)
    if alternatives:
        t4 = time.perf_counter()
        result.alternatives = _alternatives(plans, candidates, model, shape, cluster, profile, pins, limit)
        stats.phase_s["alternatives"] = time.perf_counter() - t4
    return result


def _bounded_candidates(model, shape, cluster, profile, pins, target, stats) -> tuple[list[_Candidate], tuple | None]:
    """Every legal layout as a candidate with its cost model (the cheaper MoE dispatch chosen) and its compute bound;
    and the first illegal layout with the sentence of its violation (None when none was illegal)."""
    t0 = time.perf_counter()
    candidates: list[_Candidate] = []
    shared: dict = {}
    first_violation = None
    for lay in enumerate_layouts(model, shape, cluster, pins):
        stats.layouts_enumerated += 1
        why = layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node, cluster.gpu)
        if why:
            first_violation = first_violation or (lay, why)
            continue
        stats.layouts_legal += 1
        cm = CostModel(model, shape, lay, cluster, profile, shared, target)
        if lay.ep > 1 and "ep" not in pins.no_overlap and (target.two_chunk_dispatch or target.ep_a2a_beside_layer):
            cm = _cheaper_dispatch(cm, model, shape, cluster, profile, shared)
            lay = cm.lay
        candidates.append(_Candidate(lay, cm, compute_bound_s(cm, shape, pins.recompute)))
    stats.phase_s["enumerate_and_bound"] = time.perf_counter() - t0
    return candidates, first_violation


def _runners_up(candidates, rest: list, done: set, top_k: int, shape, pins, limit, solve_work, stats) -> list:
    """The top_k - 1 runners-up after the first plan, as (step, stages, order, candidate) sorted: the evaluated layouts
    `rest`, then the layouts next in bound order scored by their greedy splits played, until the next bound exceeds
    the top_k-th step; each shown gets CP-SAT's split where that plays faster."""
    queue = [(c.compute_bound_s, i, False) for i, c in enumerate(candidates) if id(c) not in done]
    heapq.heapify(queue)
    while len(rest) < top_k - 1:  # more runners-up: greedy splits played, in bound order, below the k-th step
        kth = rest[top_k - 2][0] if len(rest) >= top_k - 1 else math.inf
        batch = _next_bounded(queue, candidates, kth, shape, pins, limit, stats, [], 1)
        if not batch:
            break
        c = batch[0]
        if not c.greedy_tried:
            c.greedy, c.greedy_tried = greedy_stages(c.cost, shape, limit, pins.recompute), True
            stats.layouts_greedy += 1
        if c.greedy is not None:
            rest.append((c.play(c.greedy).step_s, layout_order(c.layout), c, c.greedy))
            rest.sort(key=lambda x: x[:2])
    rest = rest[:top_k - 1]
    unsolved = [(c, stages) for step, _, c, stages in rest if id(c) not in done]
    better = _solve_concurrently([(c.cost, stages) for c, stages in unsolved], shape, limit, pins.recompute,
                                 solve_work) if unsolved else []
    stats.layouts_solved += len(unsolved)
    refined = {}
    for (c, stages), res in zip(unsolved, better):
        if res.stages is not None:
            step = c.play(res.stages).step_s
            if step < c.play(stages).step_s:
                refined[id(c)] = (step, res.stages)
    return sorted(((*refined.get(id(c), (step, stages)), order, c) for step, order, c, stages in rest),
                  key=lambda x: (x[0], x[2]))


def _exact_first(candidates, shape, pins, limit, solve_work, stats) -> tuple[list, tuple | None]:
    """The exact branch and bound: ([(step, order, candidate, stages)] sorted, every layout whose bound is within
    EXACT_TOLERANCE of the best step or under it evaluated exactly; (least memory bound, its layout))."""
    queue = [(c.compute_bound_s, i, False) for i, c in enumerate(candidates)]
    heapq.heapify(queue)
    min_mem: list = []
    evaluated: list[tuple[float, tuple, _Candidate, list[StagePlan]]] = []
    threads = _threads()
    while True:
        best = evaluated[0][0] if evaluated else math.inf
        batch = _next_bounded(queue, candidates, best, shape, pins, limit, stats, min_mem, threads)
        if not batch:
            break
        for c, (step, stages) in zip(batch, _evaluate_exactly(batch, shape, limit, pins.recompute, solve_work, stats)):
            if stages is not None:
                evaluated.append((step, layout_order(c.layout), c, stages))
        evaluated.sort(key=lambda x: x[:2])
    return evaluated, (min(min_mem)[::2] if min_mem else None)


def _leaders_first(candidates, shape, pins, limit, solve_work, stats) -> tuple[list, tuple | None]:
    """The default search: the LEADERS layouts the score ranks first (scoring._score with top_k LEADERS, whatever
    the caller's top_k), each evaluated exactly; ([(step, order, candidate, stages)] sorted, (least memory bound,
    its layout))."""
    scored, _, least, _ = _score(candidates, shape, pins, limit, LEADERS, stats, solve_work)
    leaders = [c for _, c, _ in scored[:LEADERS]]
    evaluated = [(step, layout_order(c.layout), c, stages)
                 for c, (step, stages) in zip(leaders, _evaluate_exactly(leaders, shape, limit, pins.recompute,
                                                                          solve_work, stats))
                 if stages is not None]
    evaluated.sort(key=lambda x: x[:2])
    return evaluated, least


def _count_unevaluated_below(candidates, done: set, best_s: float, shape, pins, limit, stats) -> tuple[int, float]:
    """The layouts not evaluated exactly whose lower bound (memory within the limit, time within EXACT_TOLERANCE of
    best_s or under it) says they could still beat or tie the first plan (0 proves it the best of every layout),
    and the lowest of their time bounds (inf when none)."""
    n, lowest = 0, math.inf
    for c in candidates:
        if id(c) in done or c.compute_bound_s > best_s * (1 + EXACT_TOLERANCE):
            continue
        _bound_fully(c, shape, pins.recompute, limit, stats)
        if c.memory_bound_bytes <= limit and c.time_bound_s <= best_s * (1 + EXACT_TOLERANCE):
            n, lowest = n + 1, min(lowest, c.time_bound_s)
    return n, lowest


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
        _bound_fully(c, shape, pins.recompute, limit, stats)
        min_mem.append((c.memory_bound_bytes, layout_order(c.layout), c.layout))
        if c.memory_bound_bytes <= limit:
            heapq.heappush(queue, (c.time_bound_s, i, True))
    return out


def _evaluate_exactly(batch: list[_Candidate], shape, limit, recompute, solve_work, stats) -> list[tuple]:
    """(step, stages) of each candidate: every (split x recompute) choice played where there are at most
    ENUMERATE_CHOICES, else its greedy split and CP-SAT's split hinted with it, both played, the faster (the greedy
    one on a tie); (inf, None) when neither fits. A function of the candidate alone, so the first plan
    does not depend on which other layouts a search evaluates."""
    for c in batch:
        if not c.greedy_tried:
            c.greedy, c.greedy_tried = greedy_stages(c.cost, shape, limit, recompute), True
            stats.layouts_greedy += 1
    small = [count_stage_choices(c.cost.m.num_layers, c.layout.num_virtual_stages, recompute, ENUMERATE_CHOICES)
             <= ENUMERATE_CHOICES for c in batch]
    played: dict[int, tuple] = {}  # id(candidate) -> its (step, stages): every choice, or its greedy split

    def play_while_solving():  # needs no solve: runs on this thread while CP-SAT solves on the others
        for c, few in zip(batch, small):
            played[id(c)] = enumerate_stages(c.cost, shape, limit, recompute) if few else \
                _fastest_fitting(c, (c.greedy,), limit)

    solved = _solve_concurrently([(c.cost, c.greedy) for c, few in zip(batch, small) if not few], shape, limit,
                                 recompute, solve_work, meanwhile=play_while_solving)
    solved_iter = iter(solved)
    out = []
    for c, few in zip(batch, small):
        if few:  # every choice played: exact for this layout
            out.append(played[id(c)])
            c.split_proven = True
            continue
        res = next(solved_iter)
        _record_solve(stats, c, res)
        # an infeasible solve proves nothing about a greedy split that fits (CP-SAT rounds memory up)
        c.split_proven = res.proven_optimal and (res.stages is not None or c.greedy is None)
        # each split played once: CP-SAT's where it differs from the greedy one, kept only if faster
        out.append(_fastest_fitting(c, (res.stages if res.stages != c.greedy else None,), limit, played[id(c)]))
    return out


def _record_solve(stats, c: _Candidate, res) -> None:
    """Count one CP-SAT solve of candidate `c`'s split in the search statistics."""
    stats.layouts_solved += 1
    stats.cpsat_variables += 3 * c.layout.num_virtual_stages
    stats.proven_optimal += int(res.proven_optimal)


def _fastest_fitting(c: _Candidate, splits, limit, best: tuple = (math.inf, None)) -> tuple:
    """(step, stages) of the fastest of `splits` (None ones skipped) as played, if faster than `best`; a split whose
    played memory exceeds `limit` is passed over (the solver rounds memory up and never allows this; a guard)."""
    for stages in splits:
        if stages is None:
            continue
        pred = c.play(stages)
        if max(pred.memory_gib_per_rank) * mem.GIB > limit * (1 + 1e-9):
            continue
        if pred.step_s < best[0]:
            best = (pred.step_s, stages)
    return best


def _first_split_refined(first: tuple, shape, limit, recompute, stats) -> tuple:
    """The first plan's entry (step, order, candidate, stages) with its layout's split solved once more at
    FIRST_SOLVE_WORK when its solve at the search's work did not end optimal, the faster split played kept: a
    function of that layout and the pins alone, so the first plan still does not depend on top_k or the entry
    point. It only gets faster, so it stays first. stats.first_split_proven says whether its split is then proven."""
    step, order, c, stages = first
    if not c.split_proven:
        res = _solve_concurrently([(c.cost, stages)], shape, limit, recompute, FIRST_SOLVE_WORK)[0]
        _record_solve(stats, c, res)
        c.split_proven = res.proven_optimal and res.stages is not None
        step, stages = _fastest_fitting(c, (res.stages,), limit, (step, stages))
    stats.first_split_proven = c.split_proven
    return step, order, c, stages


def _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem, limit, target=OURS) -> PlanError:
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
    fewest = _fewest_gpus_that_fit(model, shape, cluster, profile, pins, limit, target)
    where = f"; it needs at least {fewest} GPUs" if fewest else ""
    recompute = {None: "full", "none": "no"}.get(pins.recompute, pins.recompute)  # the bound's mode: the pin, else full
    return NoFitError(
        f"no layout of {model.name} fits in memory on {cluster.num_gpus} {cluster.gpu} GPUs: the binding "
        f"constraint is per-GPU memory, every layout needs at least {need_gib:.1f} GiB per GPU "
        f"(least: {min_mem[1].short()} with {recompute} recompute) against the {limit / mem.GIB:.1f} GiB "
        f"allowed{where}")


def _fewest_gpus_that_fit(model, shape, cluster, profile, pins, limit, target=OURS) -> int | None:
    from dataclasses import replace

    n = cluster.num_gpus
    for _ in range(12):
        n *= 2
        c2 = replace(cluster, num_gpus=n)
        for lay in enumerate_layouts(model, shape, c2, Pins(**{**pins.__dict__, "dp": None})):
            if layout_violation(model, shape, lay, n, c2.gpus_per_node, c2.gpu):
                continue
            if memory_bound_bytes(CostModel(model, shape, lay, c2, profile, target=target), pins.recompute) <= limit:
                return n
    return None
