"""The inner problem of a layout: how many layers each (virtual) pipeline stage holds and how many of them
recompute, by a greedy split (fast, feasible) or by CP-SAT (exact within its work limit); see
planner/search/__init__.py."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from planner.cost import CostModel
from planner.plan import StagePlan, TrainingShape, num_micro_batches
from planner.search.cp_sat import cp_model as load_cp_model


SOLVER_WORKERS = 8
"""CP-SAT's portfolio of workers for a solve with a wall-clock limit (solve_stages' time_limit_s; the tests'
brute-force comparisons): several strategies proving optimality beat one even on few cores."""
SOLVE_WORK = 0.01
"""CP-SAT's deterministic time (its own work measure, not seconds on the clock) per solve in the search, on one
worker: the same command gives the same plans on any machine and load, where a wall-clock limit lets the runners-up,
and now and then the first choice, change with the machine's load. On twelve catalogue cases it finds the same first
choices as a wall-clock limit of 30 ms on eight workers, within 0.05% (benchmarks/results/README.md), in about the
same time."""
FIRST_SOLVE_WORK = 0.2
"""CP-SAT's deterministic time for the first plan's layout once more when its solve at SOLVE_WORK did not end optimal
and the pins leave few layouts (the search's leaders are all of them, so it can afford one more solve): DeepSeek-V3's
61 layers over DualPipe's 16 stages on 2048 H800s, pinned, stops at its greedy split at SOLVE_WORK (23.44 s) and
reaches the optimum at 0.1 (22.19 s) in a quarter of a second. Not for wide searches: on the five cases of
benchmarks/plan_speed.py a second solve finds nothing faster and costs 0.3 s each."""
SOLVE_WALL_CAP_S = 2.0
"""A guard on a solve with a work limit (SOLVE_WORK): only a far slower machine than a laptop reaches it."""


def greedy_stages(cm: CostModel, shape: TrainingShape, limit_bytes: float,
                  recompute_pin: str | None = None) -> list[StagePlan] | None:
    """A fast feasible split (the CP-SAT hint and upper bound): layers go one at a time to the rank that
    stays fastest (optimal for identical layers without memory limits); inside a rank, extra layers go to
    the chunks with the fewest micro-batches in flight; then each rank that is over its memory recomputes
    the layers with the most micro-batches in flight, selectively first, fully if that is not enough."""

    lay, m = cm.lay, cm.m
    P, V, S = lay.pp, lay.vpp, lay.pp * lay.vpp
    num_micro = num_micro_batches(shape, lay)
    if cm.schedule.mirrored_stages:
        return _greedy_mirrored_pairs(cm, num_micro, limit_bytes, recompute_pin)
    L = cm.layer
    one = {"full": StagePlan(1, 1, 0), "selective": StagePlan(1, 0, 1)}.get(recompute_pin or "", StagePlan(1))
    gpu_layer = L.fwd_bwd_s + {"full": L.full_recompute_s, "selective": L.selective_recompute_s}.get(recompute_pin or "", 0.0)
    # a layer costs the larger of its GPU and host time (stage_time_s), plus the MoE host time that EP's
    # synchronisation exposes (stage_expert_host_s)
    host_layer = cm.stage_host_s(0, one) - cm.stage_host_s(0, StagePlan(0)) - cm.stage_expert_host_s(one)
    per_layer = max(gpu_layer, host_layer) + cm.stage_expert_host_s(one)
    ends = [sum(cm.stage_time_s(j, StagePlan(0)) for j in cm.rank_chunks(r)) for r in range(P)]
    n_rank = [V] * P
    heap = [(ends[r] + V * per_layer, r) for r in range(P)]
    heapq.heapify(heap)
    for _ in range(m.num_layers - S):
        t, r = heapq.heappop(heap)
        n_rank[r] += 1
        heapq.heappush(heap, (t + per_layer, r))
    stages: list[StagePlan | None] = [None] * S
    for r in range(P):
        js = cm.rank_chunks(r)
        terms = cm.memory_terms(r, num_micro)
        inflight = terms.in_flight
        counts = [n_rank[r] // V] * V
        for c in sorted(range(V), key=lambda c: (inflight[c], -c))[: n_rank[r] % V]:
            counts[c] += 1
        fitted = _recompute_to_fit(terms, counts, recompute_pin, limit_bytes)
        if fitted is None:
            return None
        for c, j in enumerate(js):
            stages[j] = StagePlan(counts[c], fitted[0][c], fitted[1][c])
    return stages  # type: ignore[return-value]


def stages_with_layer_counts(cm: CostModel, shape: TrainingShape, limit_bytes: float, layers: list[int],
                             recompute_pin: str | None = None) -> list[StagePlan] | None:
    """The stages of a split fixed by its layer counts (one per virtual stage, in model order), as a runtime that
    splits the layers itself runs it (Megatron-LM splits them evenly by default): each rank recomputes what it must
    to fit, as greedy_stages does (_recompute_to_fit). None when a rank does not fit."""
    stages: list[StagePlan | None] = [None] * len(layers)
    for r in range(cm.lay.pp):
        js = cm.rank_chunks(r)
        counts = [layers[j] for j in js]
        fitted = _recompute_to_fit(cm.memory_terms(r, cm.num_micro), counts, recompute_pin, limit_bytes)
        if fitted is None:
            return None
        for c, j in enumerate(js):
            stages[j] = StagePlan(counts[c], fitted[0][c], fitted[1][c])
    return stages  # type: ignore[return-value]


def _recompute_to_fit(terms, counts: list[int], recompute_pin: str | None,
                      limit_bytes: float) -> tuple[list[int], list[int]] | None:
    """(full, selective) recompute counts per chunk of one rank holding `counts` layers: the pin's, or selective
    first on the chunks holding the most micro-batches, then full where that is not enough (inflight[c] is chunk
    c's most at any moment: at the rank's peak it can hold fewer, so a chunk is topped up until the rank fits or the
    chunk is all recomputed); None when the rank does not fit."""
    V = len(counts)
    inflight = terms.in_flight
    full = counts[:] if recompute_pin == "full" else [0] * V
    sel = counts[:] if recompute_pin == "selective" else [0] * V
    held = terms.bytes(counts, full, sel)  # the rank's bytes, worked out again only when a count changes
    if recompute_pin is None:
        # selective recompute only where it frees memory (a runtime that already keeps no more than it would,
        # RuntimeTarget.fp8_activation_cache, gains nothing from it and pays its time)
        sel_pays = terms.sel_saving_bytes > 0
        for c in sorted(range(V), key=lambda c: -inflight[c]) if sel_pays else ():
            while sel[c] < counts[c] and (over := held - limit_bytes) > 0:
                sel[c] = min(counts[c], sel[c] + math.ceil(over / (inflight[c] * terms.sel_saving_bytes)))
                held = terms.bytes(counts, full, sel)
        for c in sorted(range(V), key=lambda c: -inflight[c]):
            while full[c] < counts[c] and (over := held - limit_bytes) > 0:
                extra = terms.full_saving_bytes - terms.sel_saving_bytes  # selective -> full
                full[c] += min(counts[c] - full[c], math.ceil((over + (0 if any(full) else terms.none_bytes))
                                                              / (inflight[c] * max(extra, 1.0))))
                sel[c] = min(sel[c], counts[c] - full[c])
                held = terms.bytes(counts, full, sel)
    if held > limit_bytes:
        return None
    return full, sel


def _greedy_mirrored_pairs(cm: CostModel, num_micro: int, limit_bytes: float,
                           recompute_pin: str | None) -> list[StagePlan] | None:
    """greedy_stages under a schedule whose ranks r and pp-1-r hold the same two stages (PipelineSchedule.
    mirrored_stages, DualPipe), so layers
    go one at a time to the pair of stages whose sum stays least (the ends' embedding and head counted), then each
    pair recomputes to fit as greedy_stages' ranks do."""
    P, m = cm.lay.pp, cm.m
    end_s = [cm.stage_time_s(j, StagePlan(0)) for j in range(P)]
    per_layer = cm.stage_time_s(1, StagePlan(1)) - cm.stage_time_s(1, StagePlan(0))
    counts = [1] * P
    heap = [(end_s[p] + end_s[P - 1 - p] + 2 * per_layer, p) for p in range(P // 2)]
    heapq.heapify(heap)
    for _ in range(m.num_layers - P):  # a layer to the lightest pair, inside it to the lighter stage
        t, p = heapq.heappop(heap)
        j = min((p, P - 1 - p), key=lambda j: (end_s[j] + counts[j] * per_layer, j))
        counts[j] += 1
        heapq.heappush(heap, (t + per_layer, p))
    stages: list[StagePlan | None] = [None] * P
    for r in range(P // 2):
        js = cm.rank_chunks(r)
        fitted = _recompute_to_fit(cm.memory_terms(r, num_micro), [counts[j] for j in js], recompute_pin,
                                   limit_bytes)
        if fitted is None:
            return None
        for c, j in enumerate(js):
            stages[j] = StagePlan(counts[j], fitted[0][c], fitted[1][c])
    return stages  # type: ignore[return-value]


@dataclass
class SolveResult:
    stages: list[StagePlan] | None
    proven_optimal: bool
    bound_s: float
    """The solver's proven lower bound on the pipeline part of the step (seconds)."""


@dataclass
class _StageSlopes:
    """The linear pieces of CostModel.stage_time_s in whole microseconds: per layer on the GPU (none, full, selective
    recompute), each stage's constant GPU and host time, and each stage's host time per layer by recompute mode."""
    t_layer: int
    t_full: int
    t_sel: int
    expert_per_layer: int
    gpu0: list[int]
    host0: list[int]
    h_none: list[int]
    h_full: list[int]
    h_sel: list[int]
    horizon: int
    """An upper bound of any rank's time per micro-batch: the bound of the time variables."""


def _us(seconds: float) -> int:
    return int(round(seconds * 1e6))


def _kib(num_bytes: float) -> int:
    return int(math.ceil(num_bytes / 1024))


def _stage_slopes(cm: CostModel) -> _StageSlopes:
    """stage time = max(GPU time, host time - exposed MoE host time) + that (CostModel.stage_time_s), every term linear
    in the stage's layer counts: GPU and host slopes from the cost model itself."""
    L, S = cm.layer, cm.lay.pp * cm.lay.vpp
    t_layer, t_full, t_sel = _us(L.fwd_bwd_s), _us(L.full_recompute_s), _us(L.selective_recompute_s)
    host_of = lambda j, st: _us(cm.stage_host_s(j, st) - cm.stage_expert_host_s(st))  # noqa: E731
    expert_per_layer = _us(cm.stage_expert_host_s(StagePlan(1)))
    gpu0 = [_us(cm.stage_gpu_s(j, StagePlan(0))) for j in range(S)]
    host0 = [host_of(j, StagePlan(0)) for j in range(S)]
    h_none = [host_of(j, StagePlan(1)) - host0[j] for j in range(S)]
    h_full = [host_of(j, StagePlan(1, 1, 0)) - host0[j] for j in range(S)]
    h_sel = [host_of(j, StagePlan(1, 0, 1)) - host0[j] for j in range(S)]
    per_layer_max = max(t_layer + t_full, max(h_none + h_full + h_sel + [0])) + expert_per_layer
    horizon = per_layer_max * cm.m.num_layers + sum(max(g, h) for g, h in zip(gpu0, host0)) + 1
    return _StageSlopes(t_layer, t_full, t_sel, expert_per_layer, gpu0, host0, h_none, h_full, h_sel, horizon)


def _layer_variables(mdl, cm: CostModel, recompute_pin: str | None) -> tuple[list, list, list]:
    """(n, f, s): each virtual stage's layers, fully and selectively recomputed layers, with the split's rules: every
    stage at least one layer, all layers placed, a rank's chunks within one layer of each other, the pin."""
    lay, m = cm.lay, cm.m
    S, P = lay.pp * lay.vpp, lay.pp
    n = [mdl.NewIntVar(1, m.num_layers, f"n{j}") for j in range(S)]
    f = [mdl.NewIntVar(0, m.num_layers, f"f{j}") for j in range(S)]
    s = [mdl.NewIntVar(0, m.num_layers, f"s{j}") for j in range(S)]
    mdl.Add(sum(n) == m.num_layers)
    for j in range(S):
        mdl.Add(f[j] + s[j] <= n[j])
        # virtual stages of one rank differ by at most one layer: the split across ranks stays free, and
        # the solver need not weigh the many equivalent ways of shuffling layers between a rank's chunks
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
    return n, f, s


def _stage_time(mdl, c: _StageSlopes, j: int, n, f, s):
    """Virtual stage j's time per micro-batch as a CP-SAT expression (CostModel.stage_time_s)."""
    gpu = c.t_layer * n[j] + c.t_full * f[j] + c.t_sel * s[j] + c.gpu0[j]
    tj = mdl.NewIntVar(0, c.horizon, f"t{j}")
    host = c.h_none[j] * (n[j] - f[j] - s[j]) + c.h_full[j] * f[j] + c.h_sel[j] * s[j] + c.host0[j]
    # gpu - host over any stage of at least one layer: per-layer differences (none, full, selective)
    # times counts >= 0, plus the constant; one side dominates when the differences agree in sign
    # and the smallest one-layer stage keeps that sign
    diff = (c.t_layer - c.h_none[j], c.t_layer + c.t_full - c.h_full[j], c.t_layer + c.t_sel - c.h_sel[j])
    const = c.gpu0[j] - c.host0[j]
    if min(diff) >= 0 and min(diff) + const >= 0:
        mdl.Add(tj == gpu)    # GPU-bound for every split: a linear model (and a fast solve)
    elif max(diff) <= 0 and max(diff) + const <= 0:
        mdl.Add(tj == host)   # host-bound for every split
    else:
        mdl.AddMaxEquality(tj, [gpu, host])
    return tj + c.expert_per_layer * n[j]


def _rank_fits(mdl, cm: CostModel, r: int, js: list[int], n, f, s, num_micro: int, limit_bytes: float) -> None:
    """Rank r's memory within the limit at every moment that can be its peak (MemoryTerms): the same linear terms as
    the greedy split, in KiB rounded against the plan."""
    terms = cm.memory_terms(r, num_micro)
    limit = int(limit_bytes // 1024)
    st_kib, none_kib = _kib(terms.state_per_layer_bytes), _kib(terms.none_bytes)
    dsel, dfull = int(terms.sel_saving_bytes // 1024), int(terms.full_saving_bytes // 1024)
    any_full = mdl.NewBoolVar(f"anyfull{r}")
    for j in js:
        mdl.Add(f[j] <= cm.m.num_layers * any_full)
    for h in terms.peaks:
        expr = [(st_kib + k * none_kib) * n[j] - k * dfull * f[j] - k * dsel * s[j] for k, j in zip(h, js)]
        mdl.Add(sum(expr) + _kib(terms.peak_base_bytes(h)) + none_kib * any_full <= limit)


def _stage_model(cm: CostModel, num_micro: int, limit_bytes: float, recompute_pin: str | None):
    """The CP-SAT model of the split: (model, (n, f, s) variables, the objective's scale). It minimises the
    schedule's closed form of the per-rank times (PipelineSchedule.objective_weights) within every rank's memory."""
    cp_model = load_cp_model()

    lay = cm.lay
    slopes = _stage_slopes(cm)
    mdl = cp_model.CpModel()
    n, f, s = _layer_variables(mdl, cm, recompute_pin)
    T = []
    for r in range(lay.pp):
        js = cm.rank_chunks(r)
        stage_t = [_stage_time(mdl, slopes, j, n, f, s) for j in js]
        tr = mdl.NewIntVar(0, slopes.horizon, f"T{r}")
        mdl.Add(tr == sum(stage_t))
        T.append(tr)
        _rank_fits(mdl, cm, r, js, n, f, s, num_micro, limit_bytes)
    tmax = mdl.NewIntVar(0, slopes.horizon, "tmax")
    mdl.AddMaxEquality(tmax, T)
    a, b, scale = cm.schedule.objective_weights(num_micro, lay.vpp)
    mdl.Minimize(a * tmax + (sum(T) if b == 1 else b * sum(T)))
    return mdl, (n, f, s), scale


def solve_stages(cm: CostModel, shape: TrainingShape, limit_bytes: float, recompute_pin: str | None = None,
                 time_limit_s: float = 10.0, hint: list[StagePlan] | None = None,
                 work_limit: float | None = None) -> SolveResult:
    """CP-SAT: the layer split and recompute per stage that minimise the schedule's step time within
    memory; stages None when no split fits (or none was found in the limit). work_limit: one worker for that much
    deterministic time (reproducible; the search's SOLVE_WORK), else SOLVER_WORKERS for time_limit_s seconds."""
    cp_model = load_cp_model()

    S = cm.lay.pp * cm.lay.vpp
    mdl, (n, f, s), scale = _stage_model(cm, num_micro_batches(shape, cm.lay), limit_bytes, recompute_pin)
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
        # presolve costs most of the wall time of these small models (gpt-70b on 64 GPUs, four layouts: five times
        # the solve without it, for the same splits) and little of the deterministic time
        solver.parameters.cp_model_presolve = False
    else:
        solver.parameters.num_workers = SOLVER_WORKERS
        solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.Solve(mdl)
    bound_s = solver.BestObjectiveBound() / scale / 1e6 if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else 0.0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult(None, status == cp_model.INFEASIBLE, bound_s)
    stages = [StagePlan(layers=solver.Value(n[j]), full_recompute_layers=solver.Value(f[j]),
                        selective_recompute_layers=solver.Value(s[j])) for j in range(S)]
    return SolveResult(stages, status == cp_model.OPTIMAL, bound_s)


def _solve_concurrently(jobs: list[tuple[CostModel, list[StagePlan]]], shape: TrainingShape, limit: float,
                        recompute: str | None, solve_work: float, meanwhile=None) -> list[SolveResult]:
    """solve_stages for each (cost model, hint), on as many threads as there are CPUs: CP-SAT releases the GIL
    while it solves, and each solve is single-threaded and deterministic (SOLVE_WORK), so the results do not
    depend on the threads (gpt-70b on 64 GPUs: four solves on two threads take 0.6 of the time one by one).
    meanwhile: a callable run on the calling thread while the solves run (the search plays its greedy splits
    there); its work must not depend on the solves."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        cm, hint = job
        return solve_stages(cm, shape, limit, recompute, hint=hint, work_limit=solve_work)

    threads = min(len(jobs), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if threads <= 1:
        if meanwhile is not None:
            meanwhile()
        return [one(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        solving = pool.map(one, jobs)  # every job is submitted here
        if meanwhile is not None:
            meanwhile()
        return list(solving)


ENUMERATE_CHOICES = 4000
"""A layout with at most this many (layer split x per-stage recompute) choices is split by playing every one of them
(enumerate_stages; every layout of up to 6 layers: at most 3024 choices, 6 layers in 4 stages), instead of trusting CP-SAT's closed-form objective: on tiny models the
schedule played can rank splits differently (tiny-llama, 4 layers, TP2 PP2 DP4 on 16 GPUs: CP-SAT's 2+2 split plays
0.0389 s where 3+1 plays 0.0347 s)."""


def _stage_choices(n: int, recompute_pin: str | None) -> list[tuple[int, int]]:
    """(full, selective) recompute counts a stage of n layers can take."""
    if recompute_pin == "full":
        return [(n, 0)]
    if recompute_pin == "selective":
        return [(0, n)]
    if recompute_pin == "none":
        return [(0, 0)]
    return [(f, s) for f in range(n + 1) for s in range(n + 1 - f)]


def count_stage_choices(num_layers: int, num_stages: int, recompute_pin: str | None, cap: int) -> int:
    """How many (split x recompute) choices a layout has, every stage at least one layer; counting stops above cap
    (returns cap + 1)."""
    if num_stages > num_layers or math.comb(num_layers - 1, num_stages - 1) > cap:
        return cap + 1  # more splits than cap, each with at least one recompute choice
    per_stage = (lambda n: 1) if recompute_pin else (lambda n: (n + 1) * (n + 2) // 2)  # noqa: E731
    ways = {0: 1}  # layers placed so far -> choices
    for _ in range(num_stages):
        nxt: dict[int, int] = {}
        for used, w in ways.items():
            for n in range(1, num_layers - used + 1):
                nxt[used + n] = min(cap + 1, nxt.get(used + n, 0) + w * per_stage(n))
        ways = nxt
    return min(cap + 1, ways.get(num_layers, 0))


def enumerate_stages(cm: CostModel, shape: TrainingShape, limit_bytes: float,
                     recompute_pin: str | None = None) -> tuple[float, list[StagePlan] | None]:
    """(step, stages) of the fastest split of every choice of layers and recompute per stage that fits every rank's
    memory, each played (CostModel.predict); (inf, None) when none fits. For layouts of at most ENUMERATE_CHOICES
    choices (count_stage_choices). Ties go to the first in enumeration order."""
    import itertools

    lay, L = cm.lay, cm.m.num_layers
    S, P = lay.pp * lay.vpp, lay.pp
    num_micro = num_micro_batches(shape, lay)
    best: tuple[float, list[StagePlan] | None] = (math.inf, None)
    for cuts in itertools.combinations(range(1, L), S - 1):
        counts = [b - a for a, b in zip((0,) + cuts, cuts + (L,))]
        for choice in itertools.product(*(_stage_choices(n, recompute_pin) for n in counts)):
            stages = [StagePlan(n, f, s) for n, (f, s) in zip(counts, choice)]
            if any(cm.rank_memory_bytes(r, [(j, stages[j]) for j in cm.rank_chunks(r)], num_micro)
                   > limit_bytes for r in range(P)):
                continue
            step = cm.predict(stages).step_s
            if step < best[0]:
                best = (step, stages)
    return best
