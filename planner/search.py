"""The search: enumerate legal parallel degrees, prune by a lower bound, and let OR-Tools CP-SAT decide
the integer inside of each surviving layout: how many layers each (virtual) pipeline stage holds and how
many of them recompute fully or selectively, minimising the pipeline's step time within every rank's memory.

Outer loop (branch and bound): every legal (tp, cp, pp, vpp, dp, ep, micro-batch, sharding) is given a
lower bound on its step time (perfect balance, no recompute) and a lower bound on its memory (full
recompute everywhere, perfect balance). Layouts whose memory bound exceeds the limit are dropped; the
rest are taken in order of their time bound, and the search stops once the next bound is no better than
the k-th best plan found. With pins, the user fixes any of the degrees and the search does the rest.

Inner problem (exact, CP-SAT): integer variables per virtual stage j: layers n_j >= 1, full-recompute
layers f_j and selective layers s_j with f_j + s_j <= n_j; rank time
T_r = sum_{j on r} (n_j * t_layer + f_j * t_full + s_j * t_sel) + ends_r; rank memory linear in the same
variables with each chunk's in-flight micro-batch count; objective (m*v - 1) * max_r T_r + sum_r T_r,
which is v times the schedule's step time. Times are integers in microseconds, memory in KiB rounded
up (so rounding never lets a plan past the limit).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.bounds import compute_bound_s, time_and_memory_bounds
from planner.cost import CostModel
from planner.errors import NoFitError, PlanError
from planner.legality import SHARDING_LEVELS, cuda_graph_violation, layout_violation
from planner.model import ModelSpec
from planner.plan import Layout, Plan, StagePlan, TrainingShape
from planner.profile import FP8_MODEL_NOTE, Profile, profile_argument

MAX_VPP = 8
MAX_MICRO_BATCH = 16
PLAYED_RUNNERS_UP = 4
"""Scored layouts after the CP-SAT-refined leaders whose greedy splits are played as well (the schedule's closed
form, which scores the search, misranks pipelines of different depths by a few percent; llama3-405b on 1024
GPUs: a 4% faster plan was sixth by the closed form)."""
ALTERNATIVE_SPLITS = 6
"""The alternatives' searches split at most this many of each kind's layouts, best bound first (a few tenths of a
second for all kinds together; their figures are that kind's best found, not proven best)."""
SOLVER_WORKERS = 8
"""CP-SAT's portfolio of workers for a solve with a wall-clock limit (solve_stages' time_limit_s; the tests'
brute-force comparisons): several strategies proving optimality beat one even on two cores."""
SOLVE_WORK = 0.01
"""CP-SAT's deterministic time (its own work measure, not seconds on the clock) per solve in the search, on one
worker: the same command gives the same plans on any machine and load. With a 30 ms wall-clock limit on eight
workers (before session 16) the runners-up, and now and then the first choice (mixtral-8x7b on 64 GPUs, between
plans 0.2% apart), changed from run to run on a loaded machine. On twelve catalogue cases this finds the same first
choices, one 0.05% better and one 0.015% worse (benchmarks/results/README.md, session 16), in about the same time."""
SOLVE_WALL_CAP_S = 2.0
"""A guard on a solve with a work limit (SOLVE_WORK): only a far slower machine than a laptop reaches it."""


@dataclass(frozen=True)
class Pins:
    """Dimensions the user fixed; None leaves them to the search."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    micro_batch: int | None = None
    sharding: str | None = None
    recompute: str | None = None
    """none / selective / full for every layer, or None to let the search choose per stage."""
    fp8: bool = False
    """Plan the transformer layers' GEMMs in FP8 (every layout searched uses it)."""
    grad_dtype: str = "fp32"
    """Main-gradient precision of every layout searched (Layout.grad_dtype): a numerics choice, not searched."""
    no_overlap: frozenset = frozenset()
    """Dimensions ('tp', 'dp', 'pp') whose communication must not be overlapped with compute; the search
    otherwise turns every overlap on (in this cost model overlap never costs time)."""
    cuda_graph: bool = True
    """Capture the step as a CUDA graph wherever that is legal on a GPU (Layout.cuda_graph); it removes the
    host's time and costs nothing, so it is not a searched choice. False: every plan runs eagerly."""


@dataclass
class SearchStats:
    layouts_enumerated: int = 0
    layouts_legal: int = 0
    layouts_bounded: int = 0
    """Legal layouts whose full bounds were worked out (the rest were ruled out by their compute bound)."""
    layouts_fit_bound: int = 0
    """Of those, the layouts within the memory bound."""
    layouts_greedy: int = 0
    layouts_solved: int = 0
    proven_optimal: int = 0
    cpsat_variables: int = 0
    gap_to_bound: float = 0.0
    """How far the first plan may be above the best plan of the layouts not settled by CP-SAT."""
    phase_s: dict = field(default_factory=dict)


@dataclass
class Alternative:
    """The best plan of a kind the recommended one is not (another TP degree, no pipeline, another sharding
    level, ...): what a user comparing against a familiar configuration asks about."""

    label: str
    """What differs from the recommended layout, e.g. 'TP 8' or 'no pipeline (PP 1)'."""
    plan: Plan | None
    """Its best layout with its greedy split, the schedule played; None when none of its layouts fits."""
    why: str
    """Where it loses time against the recommended plan, or why none of its layouts fits."""


@dataclass
class SearchResult:
    plans: list[Plan]
    stats: SearchStats
    alternatives: list[Alternative] = field(default_factory=list)
    """With search(alternatives=True): the best plan of each kind of layout the first plan is not."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def enumerate_layouts(model: ModelSpec, shape: TrainingShape, cluster: ClusterSpec, pins: Pins):
    """All layouts the rules allow (overlap switches on: in this cost model overlap never costs time)."""
    n = cluster.num_gpus
    tps = [pins.tp] if pins.tp else _pow2_upto(min(cluster.gpus_per_node, n))
    for tp in tps:
        cps = [pins.cp] if pins.cp else _pow2_upto(n // tp)
        for cp in cps:
            if n % (tp * cp):
                continue
            rest = n // (tp * cp)
            pps = [pins.pp] if pins.pp else [p for p in _divisors(rest) if p <= model.num_layers]
            for pp in pps:
                if rest % pp:
                    continue
                dp = rest // pp
                if pins.dp and pins.dp != dp:
                    continue
                vpps = [pins.vpp] if pins.vpp else ([1] if pp == 1 else
                                                    [v for v in range(1, MAX_VPP + 1) if pp * v <= model.num_layers])
                eps = [pins.ep] if pins.ep else [e for e in _divisors(model.num_experts) if (dp * cp) % e == 0]
                if shape.global_batch % dp:
                    mbs = [pins.micro_batch] if pins.micro_batch else []
                else:
                    per_replica = shape.global_batch // dp
                    mbs = [pins.micro_batch] if pins.micro_batch else \
                        [b for b in _divisors(per_replica) if b <= MAX_MICRO_BATCH]
                # with several data-parallel ranks, 'none' (plain DDP) is dominated by 'optimizer': the
                # distributed optimizer moves fewer bytes (fp32 reduce-scatter + bf16 all-gather against
                # an fp32 all-reduce), steps a smaller shard and holds less memory; it pays one more
                # collective latency (tens of microseconds a step), so 'none' is searched only when pinned
                shards = [pins.sharding] if pins.sharding else \
                    (["none"] if dp * cp == 1 else [s for s in SHARDING_LEVELS if s != "none"])
                for vpp in vpps:
                    for ep in eps:
                        for mb in mbs:
                            for sh in shards:
                                kw = dict(tp=tp, pp=pp, vpp=vpp, dp=dp, cp=cp, ep=ep, micro_batch=mb, sharding=sh,
                                          overlap_tp="tp" not in pins.no_overlap, overlap_dp="dp" not in pins.no_overlap,
                                          overlap_pp="pp" not in pins.no_overlap, fp8=pins.fp8,
                                          grad_dtype=pins.grad_dtype)
                                lay = Layout(**kw)
                                if pins.cuda_graph and cuda_graph_violation(model, lay, cluster.gpu) is None:
                                    lay = Layout(**kw, cuda_graph=True)  # (dataclasses.replace is 5x slower)
                                yield lay


@dataclass
class _Candidate:
    layout: Layout
    cost: CostModel
    compute_bound_s: float
    """bounds.compute_bound_s: cheap, below time_bound_s; the order the layouts are examined in."""
    time_bound_s: float = math.nan
    memory_bound_bytes: float = math.nan
    """bounds.time_and_memory_bounds, worked out only for layouts whose compute bound could still beat the k-th best plan."""
    greedy: list[StagePlan] | None = None
    greedy_tried: bool = False
    """greedy_stages, kept for the alternatives' searches (None: no split fits, or not tried yet)."""


def greedy_stages(cm: CostModel, shape: TrainingShape, limit_bytes: float,
                  recompute_pin: str | None = None) -> list[StagePlan] | None:
    """A fast feasible split (the CP-SAT hint and upper bound): layers go one at a time to the rank that
    stays fastest (optimal for identical layers without memory limits); inside a rank, extra layers go to
    the chunks with the fewest micro-batches in flight; then each rank that is over its memory recomputes
    the layers with the most micro-batches in flight, selectively first, fully if that is not enough."""

    lay, m = cm.lay, cm.m
    P, V, S = lay.pp, lay.vpp, lay.pp * lay.vpp
    num_micro = shape.global_batch // (lay.micro_batch * lay.dp)
    L = cm.layer
    one = {"full": StagePlan(1, 1, 0), "selective": StagePlan(1, 0, 1)}.get(recompute_pin or "", StagePlan(1))
    gpu_layer = L.fwd_bwd_s + {"full": L.full_recompute_s, "selective": L.selective_recompute_s}.get(recompute_pin or "", 0.0)
    # a layer costs the larger of its GPU and host time (stage_time_s), plus the MoE host time that EP's
    # synchronisation exposes (stage_expert_host_s)
    host_layer = cm.stage_host_s(0, one) - cm.stage_host_s(0, StagePlan(0)) - cm.stage_expert_host_s(one)
    per_layer = max(gpu_layer, host_layer) + cm.stage_expert_host_s(one)
    ends = [sum(cm.stage_time_s(j, StagePlan(0)) for j in range(r, S, P)) for r in range(P)]
    n_rank = [V] * P
    heap = [(ends[r] + V * per_layer, r) for r in range(P)]
    heapq.heapify(heap)
    for _ in range(m.num_layers - S):
        t, r = heapq.heappop(heap)
        n_rank[r] += 1
        heapq.heappush(heap, (t + per_layer, r))
    stages: list[StagePlan | None] = [None] * S
    for r in range(P):
        js = list(range(r, S, P))
        terms = cm.memory_terms(r, num_micro)
        inflight = terms.in_flight
        counts = [n_rank[r] // V] * V
        for c in sorted(range(V), key=lambda c: (inflight[c], -c))[: n_rank[r] % V]:
            counts[c] += 1
        full = counts[:] if recompute_pin == "full" else [0] * V
        sel = counts[:] if recompute_pin == "selective" else [0] * V
        if recompute_pin is None:
            # selective first on the chunks holding the most micro-batches, then full where that is not enough
            for c in sorted(range(V), key=lambda c: -inflight[c]):
                over = terms.bytes(counts, full, sel) - limit_bytes
                if over <= 0:
                    break
                sel[c] = min(counts[c], math.ceil(over / (inflight[c] * terms.sel_saving_bytes)))
            for c in sorted(range(V), key=lambda c: -inflight[c]):
                over = terms.bytes(counts, full, sel) - limit_bytes
                if over <= 0:
                    break
                extra = terms.full_saving_bytes - terms.sel_saving_bytes  # selective -> full
                add = min(counts[c] - full[c], math.ceil((over + (0 if any(full) else terms.none_bytes))
                                                         / (inflight[c] * max(extra, 1.0))))
                full[c] += add
                sel[c] = min(sel[c], counts[c] - full[c])
        if terms.bytes(counts, full, sel) > limit_bytes:
            return None
        for c, j in enumerate(js):
            stages[j] = StagePlan(counts[c], full[c], sel[c])
    return stages  # type: ignore[return-value]


@dataclass
class SolveResult:
    stages: list[StagePlan] | None
    proven_optimal: bool
    bound_s: float
    """The solver's proven lower bound on the pipeline part of the step (seconds)."""


def solve_stages(cm: CostModel, shape: TrainingShape, limit_bytes: float, recompute_pin: str | None = None,
                 time_limit_s: float = 10.0, hint: list[StagePlan] | None = None,
                 work_limit: float | None = None) -> SolveResult:
    """CP-SAT: the layer split and recompute per stage that minimise the schedule's step time within
    memory; stages None when no split fits (or none was found in the limit). work_limit: one worker for that much
    deterministic time (reproducible; the search's SOLVE_WORK), else SOLVER_WORKERS for time_limit_s seconds."""
    from ortools.sat.python import cp_model

    lay, m = cm.lay, cm.m
    S, P, V = lay.pp * lay.vpp, lay.pp, lay.vpp
    num_micro = shape.global_batch // (lay.micro_batch * lay.dp)
    L = cm.layer
    us = lambda s: int(round(s * 1e6))  # noqa: E731
    kib = lambda b: int(math.ceil(b / 1024))  # noqa: E731
    t_layer, t_full, t_sel = us(L.fwd_bwd_s), us(L.full_recompute_s), us(L.selective_recompute_s)
    limit = int(limit_bytes // 1024)

    mdl = cp_model.CpModel()
    n = [mdl.NewIntVar(1, m.num_layers, f"n{j}") for j in range(S)]
    f = [mdl.NewIntVar(0, m.num_layers, f"f{j}") for j in range(S)]
    s = [mdl.NewIntVar(0, m.num_layers, f"s{j}") for j in range(S)]
    mdl.Add(sum(n) == m.num_layers)
    for j in range(S):
        mdl.Add(f[j] + s[j] <= n[j])
        # virtual stages of one rank differ by at most one layer: the split across ranks stays free, and
        # the solver is spared the many equivalent ways of shuffling layers between a rank's chunks
        if j + P < S:
            mdl.Add(n[j] - n[j + P] <= 1)
            mdl.Add(n[j + P] - n[j] <= 1)
        if recompute_pin == "full":
            mdl.Add(f[j] == n[j])
        elif recompute_pin == "selective":
            mdl.Add(s[j] == n[j])
        elif recompute_pin == "none":
            mdl.Add(f[j] == 0)
            mdl.Add(s[j] == 0)
    # stage time = max(GPU time, host time - exposed MoE host time) + that (CostModel.stage_time_s), every
    # term linear in the stage's layer counts: GPU and host slopes from the cost model itself
    host_of = lambda j, st: us(cm.stage_host_s(j, st) - cm.stage_expert_host_s(st))  # noqa: E731
    expert_per_layer = us(cm.stage_expert_host_s(StagePlan(1)))
    gpu0 = [us(cm.stage_gpu_s(j, StagePlan(0))) for j in range(S)]
    host0 = [host_of(j, StagePlan(0)) for j in range(S)]
    h_none = [host_of(j, StagePlan(1)) - host0[j] for j in range(S)]
    h_full = [host_of(j, StagePlan(1, 1, 0)) - host0[j] for j in range(S)]
    h_sel = [host_of(j, StagePlan(1, 0, 1)) - host0[j] for j in range(S)]
    per_layer_max = max(t_layer + t_full, max(h_none + h_full + h_sel + [0])) + expert_per_layer
    horizon = per_layer_max * m.num_layers + sum(max(g, h) for g, h in zip(gpu0, host0)) + 1
    T = []
    for r in range(P):
        js = [j for j in range(S) if j % P == r]
        stage_t = []
        for j in js:
            gpu = t_layer * n[j] + t_full * f[j] + t_sel * s[j] + gpu0[j]
            tj = mdl.NewIntVar(0, horizon, f"t{j}")
            host = h_none[j] * (n[j] - f[j] - s[j]) + h_full[j] * f[j] + h_sel[j] * s[j] + host0[j]
            # gpu - host over any stage of at least one layer: per-layer differences (none, full, selective)
            # times counts >= 0, plus the constant; one side dominates when the differences agree in sign
            # and the smallest one-layer stage keeps that sign
            diff = (t_layer - h_none[j], t_layer + t_full - h_full[j], t_layer + t_sel - h_sel[j])
            const = gpu0[j] - host0[j]
            if min(diff) >= 0 and min(diff) + const >= 0:
                mdl.Add(tj == gpu)    # GPU-bound for every split: a linear model (and a fast solve)
            elif max(diff) <= 0 and max(diff) + const <= 0:
                mdl.Add(tj == host)   # host-bound for every split
            else:
                mdl.AddMaxEquality(tj, [gpu, host])
            stage_t.append(tj + expert_per_layer * n[j])
        tr = mdl.NewIntVar(0, horizon, f"T{r}")
        mdl.Add(tr == sum(stage_t))
        T.append(tr)
        # memory of rank r: the same linear terms as the greedy split, in KiB rounded against the plan
        terms = cm.memory_terms(r, num_micro)
        st_kib, none_kib = kib(terms.state_per_layer_bytes), kib(terms.none_bytes)
        dsel, dfull = int(terms.sel_saving_bytes // 1024), int(terms.full_saving_bytes // 1024)
        expr = [(st_kib + k * none_kib) * n[j] - k * dfull * f[j] - k * dsel * s[j]
                for k, j in zip(terms.in_flight, js)]
        any_full = mdl.NewBoolVar(f"anyfull{r}")
        for j in js:
            mdl.Add(f[j] <= m.num_layers * any_full)
        mdl.Add(sum(expr) + kib(terms.base_bytes) + none_kib * any_full <= limit)
    tmax = mdl.NewIntVar(0, horizon, "tmax")
    mdl.AddMaxEquality(tmax, T)
    mdl.Minimize((num_micro * V - 1) * tmax + sum(T))
    if hint:
        for j in range(S):
            mdl.AddHint(n[j], hint[j].layers)
            mdl.AddHint(f[j], hint[j].full_recompute_layers)
            mdl.AddHint(s[j], hint[j].selective_recompute_layers)
    solver = cp_model.CpSolver()
    if work_limit is not None:
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = work_limit
        solver.parameters.max_time_in_seconds = SOLVE_WALL_CAP_S
    else:
        solver.parameters.num_workers = SOLVER_WORKERS
        solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.Solve(mdl)
    bound_s = solver.BestObjectiveBound() / V / 1e6 if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0.0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(None, status == cp_model.INFEASIBLE, bound_s)
    stages = [StagePlan(layers=solver.Value(n[j]), full_recompute_layers=solver.Value(f[j]),
                        selective_recompute_layers=solver.Value(s[j])) for j in range(S)]
    return SolveResult(stages, status == cp_model.OPTIMAL, bound_s)


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


def _score(candidates: list[_Candidate], shape: TrainingShape, pins: Pins, limit: float, top_k: int,
           stats: SearchStats, solve_work: float | None, max_splits: float = math.inf):
    """The top_k candidates by the score of a split (CostModel.predict(play=False)): best bound first, a layout
    known by its compute bound gets its full bounds (memory, and time with communication and optimizer) and goes
    back in line; one known by its full bound gets a greedy split (CP-SAT where that finds none, while fewer than
    top_k are scored, unless solve_work is None). So the splits come in the order of the full bounds, and only
    layouts whose compute bound is below the k-th best are bounded in full. Bounds and splits are kept on the
    candidates for later calls. Returns (scored [(score, candidate, stages)], the lowest bound of the layouts not
    scored, (least memory bound, its layout) among those bounded, whether max_splits cut the search short).
    max_splits: stop after splitting that many layouts, or trying four times as many (the alternatives' searches:
    their best among the most promising, not proven best)."""
    queue = [(c.compute_bound_s, i, False) for i, c in enumerate(candidates)]
    heapq.heapify(queue)
    scored: list[tuple[float, _Candidate, list[StagePlan]]] = []
    kth = math.inf
    unsettled_bound = math.inf
    min_mem: tuple[float, Layout] | None = None
    splits = tries = 0  # layouts split, and split or tried (a greedy split can find nothing within memory)
    while queue and splits < max_splits and tries < 4 * max_splits:
        bound_s, i, bounded = heapq.heappop(queue)
        if bound_s >= kth:  # so is every layout's still in line
            unsettled_bound = bound_s
            break
        c = candidates[i]
        if not bounded:
            if math.isnan(c.time_bound_s):
                c.time_bound_s, c.memory_bound_bytes = time_and_memory_bounds(c.cost, shape, pins.recompute, limit)
                stats.layouts_bounded += 1
                stats.layouts_fit_bound += c.memory_bound_bytes <= limit
            if min_mem is None or c.memory_bound_bytes < min_mem[0]:
                min_mem = (c.memory_bound_bytes, c.layout)
            if c.memory_bound_bytes <= limit:
                heapq.heappush(queue, (c.time_bound_s, i, True))
            continue
        if not c.greedy_tried:
            c.greedy, c.greedy_tried = greedy_stages(c.cost, shape, limit, pins.recompute), True
            stats.layouts_greedy += 1
        stages = c.greedy
        tries += 1
        if stages is None and len(scored) < top_k and solve_work is not None:
            stages = solve_stages(c.cost, shape, limit, pins.recompute, work_limit=solve_work).stages
            stats.layouts_solved += 1
        if stages is None:
            continue
        splits += 1
        step = c.cost.predict(stages, play=False).step_s
        scored.append((step, c, stages))
        scored.sort(key=lambda x: x[0])
        if len(scored) >= top_k:
            kth = scored[top_k - 1][0]
    return scored, unsettled_bound, min_mem, bool(queue) and (splits >= max_splits or tries >= 4 * max_splits)


def search(model: ModelSpec, shape: TrainingShape, cluster: ClusterSpec, profile: Profile,
           pins: Pins = Pins(), top_k: int = 4, refine: int = 0, solve_work: float = SOLVE_WORK,
           progress=None, alternatives: bool = False) -> SearchResult:
    """Best plans first. Phases: enumerate every legal layout with a cheap bound (its layers' compute); in that
    bound's order, the full time and memory bounds of each layout that could still beat the k-th best, and a
    greedy split of each whose full bound could too; CP-SAT on the `top_k + refine` best of those (hinted with
    the greedy split, `solve_work` of deterministic time each); the schedule played for those and the next
    PLAYED_RUNNERS_UP, which ranks the plans. The stats say how close the result is proven to be: the first
    plan's step over the lowest bound of every layout that CP-SAT did not settle. alternatives: also the best
    plan of each kind of layout the first plan is not (planner/why_not.py), from the same candidates."""
    stats = SearchStats()
    t0 = time.perf_counter()
    limit = mem.memory_limit_bytes(cluster.usable_memory_gib)
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
        raise _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem, limit)
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
        raise _no_fit(model, shape, cluster, profile, pins, stats, first_violation, min_mem, limit)
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


def _solve_concurrently(jobs: list[tuple[CostModel, list[StagePlan]]], shape: TrainingShape, limit: float,
                        recompute: str | None, solve_work: float) -> list[SolveResult]:
    """solve_stages for each (cost model, hint), on as many threads as there are CPUs: CP-SAT releases the GIL
    while it solves, and each solve is single-threaded and deterministic (SOLVE_WORK), so the results do not
    depend on the threads (gpt-70b on 64 GPUs: four solves in 0.16 s on two cores against 0.27 s one by one)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        cm, hint = job
        return solve_stages(cm, shape, limit, recompute, hint=hint, work_limit=solve_work)

    threads = min(len(jobs), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if threads <= 1:
        return [one(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, jobs))


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


def _plan_of(c: _Candidate, stages: list[StagePlan], pred, model, shape, cluster, profile) -> Plan:
    prov = plan_provenance(profile, c.layout.fp8)
    off_grid, queries = c.cost.interpolated_gemms()
    if off_grid:  # say so: between the grid's points cuBLAS can run 10-30% off the interpolated rate
        prov["modelled"].insert(0, f"GEMMs: {off_grid} of this layout's {queries} layer GEMM shapes interpolated "
                                   f"between profile points (`plan profile --model {model.name} --base "
                                   f"{profile_argument(profile)}` measures them and adds them to this profile)")
    if not profile.attention_measured(model.head_dim, model.causal):
        as_dim = profile.attention_kernel_head_dim(model.head_dim, model.causal)
        how = (f"priced as {as_dim}, the next larger one measured (kernels pad to their tile)" if as_dim != model.head_dim
               else "read at the nearest measured one's rate")
        prov["modelled"].insert(0, f"attention: head dimension {model.head_dim} not measured, {how} (`plan profile "
                                   f"--model {model.name} --base {profile_argument(profile)}` measures it)")
    return Plan(model=model, cluster=cluster.to_dict(), training=shape, layout=c.layout, stages=stages,
                prediction=pred, provenance=prov)


def _alternatives(plans: list[Plan], candidates: list[_Candidate], model, shape, cluster, profile, pins,
                  limit: float) -> list[Alternative]:
    """For each kind of layout the first plan is not (planner/why_not.py), its best layout by the same scoring as
    the search (bounds and greedy splits reused from it; no CP-SAT), with the schedule played, or the search's
    own runner-up of that kind where that plays faster."""
    from planner.why_not import alternative_kinds, why_it_loses

    best = plans[0]
    out = []
    scratch = SearchStats()  # the alternatives' work is not the search's
    for label, keep in alternative_kinds(best.layout, [c.layout for c in candidates], model):
        kind = [c for c in candidates if keep(c.layout)]
        scored, _, least, cut_short = _score(kind, shape, pins, limit, 1, scratch, None, ALTERNATIVE_SPLITS)
        if scored:
            _, c, stages = scored[0]
            found = [_plan_of(c, stages, c.cost.predict(stages), model, shape, cluster, profile)]
            plan = min(found + [p for p in plans[1:] if keep(p.layout)], key=lambda p: p.prediction.step_s)
            out.append(Alternative(label, plan, why_it_loses(best.prediction, plan.prediction)))
        elif cut_short:
            out.append(Alternative(label, None, f"none of its {4 * ALTERNATIVE_SPLITS} most promising layouts has a "
                                                f"greedy split within the {limit / mem.GIB:.1f} GiB allowed per GPU"))
        elif least is not None and least[0] > limit:
            out.append(Alternative(label, None, f"does not fit: each of its layouts needs at least "
                                                f"{least[0] / mem.GIB:.1f} GiB per GPU against the "
                                                f"{limit / mem.GIB:.1f} GiB allowed"))
        else:
            out.append(Alternative(label, None, "does not fit: no greedy layer split and recompute of its layouts "
                                                f"stays within the {limit / mem.GIB:.1f} GiB allowed per GPU"))
    return out


def plan_provenance(profile: Profile, fp8: bool = False) -> dict:
    """Which profile the times came from, and which of its figures are measured and which modelled."""
    prov = profile.provenance
    measured, modelled = list(prov.get("measured", [])), list(prov.get("modelled", []))
    if fp8 and not profile.fp8_measured:
        modelled.append(FP8_MODEL_NOTE)
    for part in prov.get("parts", []):
        status = str(part.get("status", ""))
        text = part.get("part", "?") + (f" ({part['model']})" if "model" in part else "")
        (measured if status == "measured" else modelled).append(text if status in ("measured", "modelled")
                                                                else f"{text}: {status}")
    return {"profile": profile.source_path or profile.gpu, "profile_gpu": profile.gpu,
            "profile_measured_on": prov.get("gpu_name", prov.get("measured_on", "")),
            "profile_date": prov.get("date", ""), "profile_commit": prov.get("git_commit", ""),
            "profile_kind": ("derived from " + str(prov["derived_from"].get("gpu_name", "another GPU"))
                             if isinstance(prov.get("derived_from"), dict) else prov.get("kind", prov.get("mode", "measured"))),
            "measured": measured,
            "modelled": modelled + [f"memory allowance: {mem.RESERVED_GIB} GiB outside the allocator, "
                                    f"{mem.FRAGMENTATION:.0%} fragmentation"],
            "profile_warnings": ([f"host time per layer out of recompute order (probe noise; recompute choices of "
                                  f"host-paced plans may be misjudged): {v}"
                                  for v in profile.host.recompute_order_violations()]
                                 if profile.host is not None else [])}


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
