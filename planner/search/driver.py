"""The branch-and-bound driver: enumerate, bound and score the layouts, refine the leaders with CP-SAT, play the
schedule of the plans it keeps, and say in one sentence why nothing fits when nothing does."""
from __future__ import annotations

import math
import time
from dataclasses import replace

from planner import memory as mem
from planner.bounds import compute_bound_s, time_and_memory_bounds
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.cost.targets import OURS, RuntimeTarget
from planner.errors import NoFitError, PlanError
from planner.legality import layout_violation
from planner.model import ModelSpec
from planner.plan import Layout, Plan, StagePlan, TrainingShape
from planner.profile import Profile
from planner.search.alternatives import _alternatives
from planner.search.layouts import enumerate_layouts
from planner.search.result import Pins, SearchResult, SearchStats
from planner.search.scoring import _Candidate, _plan_of, _score
from planner.search.stages import SOLVE_WORK, _solve_concurrently, solve_stages


PLAYED_RUNNERS_UP = 4
"""Scored layouts after the CP-SAT-refined leaders whose greedy splits are played as well (the schedule's closed
form, which scores the search, misranks pipelines of different depths by a few percent; llama3-405b on 1024
GPUs: a 4% faster plan was sixth by the closed form)."""


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
                    shared, cm.target)
    if flip is None:
        one_layer = StagePlan(1)

        def layer_s(c):
            return c.layer.fwd_bwd_s + c.stage_expert_host_s(one_layer)

        flip = shared[key] = layer_s(cm2) < layer_s(cm)
    return cm2 if flip else cm


def search(model: ModelSpec, shape: TrainingShape, cluster: ClusterSpec, profile: Profile,
           pins: Pins = Pins(), top_k: int = 4, refine: int = 0, solve_work: float = SOLVE_WORK,
           progress=None, alternatives: bool = False, target: RuntimeTarget = OURS) -> SearchResult:
    """Best plans first. Phases: enumerate every legal layout with a cheap bound (its layers' compute); in that
    bound's order, the full time and memory bounds of each layout that could still beat the k-th best, and a
    greedy split of each whose full bound could too; CP-SAT on the `top_k + refine` best of those (hinted with
    the greedy split, `solve_work` of deterministic time each); the schedule played for those and the next
    PLAYED_RUNNERS_UP, which ranks the plans. The stats say how close the result is proven to be: the first
    plan's step over the lowest bound of every layout that CP-SAT did not settle. alternatives: also the best
    plan of each kind of layout the first plan is not (planner/search/alternatives.py), from the same candidates.
    target: the runtime predicted for (planner/cost/targets.py); one that cannot capture CUDA graphs plans eagerly."""
    if not target.cuda_graph and pins.cuda_graph:
        pins = replace(pins, cuda_graph=False)
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
        cm = CostModel(model, shape, lay, cluster, profile, shared, target)
        if lay.ep > 1 and "ep" not in pins.no_overlap and target.two_chunk_dispatch:
            cm = _cheaper_dispatch(cm, model, shape, cluster, profile, shared)
            lay = cm.lay
        candidates.append(_Candidate(lay, cm, compute_bound_s(cm, shape, pins.recompute)))
    stats.phase_s["enumerate_and_bound"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    scored, unsettled_bound, min_mem, _ = _score(candidates, shape, pins, limit, top_k, stats, solve_work)
    stats.phase_s["greedy"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    refined: list[tuple[float, _Candidate, list[StagePlan], bool]] = []
    leaders = scored[: top_k + refine]
    solved = _solve_concurrently([(c.cost, stages) for _, c, stages in leaders], shape, limit, pins.recompute,
                                 solve_work)
    for (step, c, stages), res in zip(leaders, solved):
        stats.layouts_solved += 1
        stats.cpsat_variables += 3 * c.layout.num_virtual_stages
        proven = res.proven_optimal
        if res.stages is not None:
            s2 = c.cost.predict(res.stages, play=False).step_s
            if s2 < step:
                step, stages = s2, res.stages
        stats.proven_optimal += int(proven)
        refined.append((step, c, stages, proven))
    for step, c, stages in scored[top_k + refine:]:
        unsettled_bound = min(unsettled_bound, c.time_bound_s)
    refined.sort(key=lambda x: x[0])
    stats.phase_s["cpsat"] = time.perf_counter() - t2
    if not refined:
        raise _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem, limit, target)
    plans = []
    for step, c, stages, proven in refined[:top_k + refine]:
        pred = c.cost.predict(stages)  # the schedule played: the figure the plan reports and is ranked by
        if max(pred.memory_gib_per_rank) * mem.GIB > limit * (1 + 1e-9):
            continue  # the solver rounds memory up and never allows this; kept as a guard
        plans.append(_plan_of(c, stages, pred, model, shape, cluster, profile))
    # the closed form ranks pipelines of different depths only roughly (it puts every hop on the path): the next
    # runners-up are played too, with their greedy splits, and one that plays faster than the first plan gets
    # CP-SAT's split where that plays faster still
    t4 = time.perf_counter()
    for step, c, stages in scored[top_k + refine: top_k + refine + PLAYED_RUNNERS_UP]:
        plans.append(_plan_of(c, stages, c.cost.predict(stages), model, shape, cluster, profile))
    plans.sort(key=lambda p: p.prediction.step_s)
    if all(plans[0].layout != c.layout for _, c, _, _ in refined):
        c = next(c for _, c, _ in scored if c.layout == plans[0].layout)
        plans[0] = _faster_split(c, plans[0], model, shape, cluster, profile, pins, limit, solve_work, stats)
    stats.phase_s["played_runners_up"] = time.perf_counter() - t4
    plans = plans[:top_k]
    if not plans:
        raise _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem, limit, target)
    best = plans[0].prediction.step_s
    stats.gap_to_bound = max(0.0, best / unsettled_bound - 1) if unsettled_bound < math.inf and best > unsettled_bound else 0.0
    result = SearchResult(plans=plans, stats=stats)
    if alternatives:
        t3 = time.perf_counter()
        alts = _alternatives(plans, candidates, model, shape, cluster, profile, pins, limit)
        # the search ranks its candidates by the schedule's closed form and plays only the ones it keeps; an
        # alternative's best, played, can come out ahead of them: it then joins the plans (CP-SAT's split or the
        # greedy one, whichever plays faster), and the alternatives are taken against the new first plan
        faster = [a.plan for a in alts if a.plan is not None and a.plan.prediction.step_s < plans[0].prediction.step_s]
        if faster:
            for alt in faster:
                c = next(c for c in candidates if c.layout == alt.layout)
                plans.append(_faster_split(c, alt, model, shape, cluster, profile, pins, limit, solve_work, stats))
            plans.sort(key=lambda p: p.prediction.step_s)
            del plans[top_k:]
            alts = _alternatives(plans, candidates, model, shape, cluster, profile, pins, limit)
        result.alternatives = alts
        stats.phase_s["alternatives"] = time.perf_counter() - t3
    return result


def _faster_split(c: _Candidate, plan: Plan, model, shape, cluster, profile, pins, limit, solve_work,
                  stats: SearchStats) -> Plan:
    """plan (c's layout with a greedy split, played) or CP-SAT's split hinted with it, whichever plays faster."""
    res = solve_stages(c.cost, shape, limit, pins.recompute, hint=plan.stages, work_limit=solve_work)
    stats.layouts_solved += 1
    if res.stages is not None:
        pred = c.cost.predict(res.stages)
        if pred.step_s < plan.prediction.step_s:
            return _plan_of(c, res.stages, pred, model, shape, cluster, profile)
    return plan


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
    return NoFitError(
        f"no layout of {model.name} fits in memory on {cluster.num_gpus} {cluster.gpu} GPUs: the binding "
        f"constraint is per-GPU memory, every layout needs at least {need_gib:.1f} GiB per GPU "
        f"(least: {min_mem[1].short()} with full recompute) against the {limit / mem.GIB:.1f} GiB allowed{where}")


def _fewest_gpus_that_fit(model, shape, cluster, profile, pins, limit, target=OURS) -> int | None:
    from dataclasses import replace

    n = cluster.num_gpus
    for _ in range(12):
        n *= 2
        c2 = replace(cluster, num_gpus=n)
        for lay in enumerate_layouts(model, shape, c2, Pins(**{**pins.__dict__, "dp": None})):
            if layout_violation(model, shape, lay, n, c2.gpus_per_node):
                continue
            _, m_lb = time_and_memory_bounds(CostModel(model, shape, lay, c2, profile, target=target), shape,
                                             pins.recompute)
            if m_lb <= limit:
                return n
    return None
