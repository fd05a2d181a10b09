"""CP-SAT's stage split against brute force on small spaces; search() against every even split; pins."""
from __future__ import annotations

import itertools

import pytest

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.legality import layout_violation
from planner.model import ModelSpec, tiny_model
from planner.plan import StagePlan, TrainingShape, Layout, even_stages
from planner.search import Pins, enumerate_layouts, search, solve_stages

# a model big enough that times are milliseconds (CP-SAT works in integer microseconds)
SMALL = ModelSpec(name="small", family="gpt", num_layers=6, hidden=1024, num_heads=16, num_kv_heads=16,
                  ffn_hidden=4096, vocab_size=8192, max_seq_len=2048, default_seq_len=2048,
                  default_global_batch=8, tie_embeddings=True)


def _objective(cm, stages, m, v):
    P = cm.lay.pp
    T = [sum(cm.stage_time_s(j, stages[j]) for j in range(r, len(stages), P)) for r in range(P)]
    return (m * v - 1) * max(T) + sum(T)


def _fits(cm, stages, m, limit):
    P, S = cm.lay.pp, len(stages)
    for r in range(P):
        js = list(range(r, S, P))
        terms = cm.memory_terms(r, m)
        b = terms.bytes([stages[j].layers for j in js], [stages[j].full_recompute_layers for j in js],
                        [stages[j].selective_recompute_layers for j in js])
        if b > limit:
            return False
    return True


def _brute_force(cm, L, m, limit):
    """Every split of L layers into S >= 1-layer stages and every (full, selective) count per stage."""
    P, V = cm.lay.pp, cm.lay.vpp
    S = P * V
    best = (float("inf"), None)
    for cuts in itertools.combinations(range(1, L), S - 1):
        counts = [b - a for a, b in zip((0,) + cuts, cuts + (L,))]
        per_stage = [[(f, s) for f in range(n + 1) for s in range(n + 1 - f)] for n in counts]
        for choice in itertools.product(*per_stage):
            stages = [StagePlan(n, f, s) for n, (f, s) in zip(counts, choice)]
            if not _fits(cm, stages, m, limit):
                continue
            obj = _objective(cm, stages, m, V)
            if obj < best[0]:
                best = (obj, stages)
    return best


def _limits(cm, L, m):
    """Memory limits between 'everything fully recomputed' and 'nothing recomputed' of an even split."""
    P, V = cm.lay.pp, cm.lay.vpp
    lo = max(cm.rank_memory_bytes(r, [(j, st) for j, st in enumerate(even_stages(L, P * V, "full")) if j % P == r], m)
             for r in range(P))
    hi = max(cm.rank_memory_bytes(r, [(j, st) for j, st in enumerate(even_stages(L, P * V)) if j % P == r], m)
             for r in range(P))
    return [lo + (hi - lo) * x for x in (0.25, 0.55, 0.85)]


CASES = [  # pp, vpp, layers, micro-batches
    (2, 1, 6, 4),
    (3, 1, 7, 6),
    (2, 2, 6, 4),
    (3, 2, 7, 6),
]


@pytest.mark.parametrize("pp,vpp,L,m", CASES)
def test_cpsat_matches_brute_force(profile, pp, vpp, L, m):
    model = ModelSpec(**{**SMALL.__dict__, "num_layers": L})
    shape = TrainingShape(seq_len=2048, global_batch=m)
    lay = Layout(pp=pp, vpp=vpp, micro_batch=1, sharding="none")
    cm = CostModel(model, shape, lay, ClusterSpec(num_gpus=pp, gpus_per_node=8), profile)
    for limit in _limits(cm, L, m):
        best, best_stages = _brute_force(cm, L, m, limit)
        res = solve_stages(cm, shape, limit, time_limit_s=30.0)
        assert best_stages is not None
        assert res.stages is not None, f"CP-SAT found nothing at limit {limit} where brute force found {best_stages}"
        assert _fits(cm, res.stages, m, limit)
        got = _objective(cm, res.stages, m, vpp)
        # rounding: times are whole microseconds in the solver (<= 0.5 us per term of each rank's sum)
        tol = (m * vpp - 1 + pp) * 0.5e-6 * (3 * L + pp * vpp)
        assert got <= best + tol, (limit, best_stages, res.stages, best, got)
        assert res.proven_optimal


def test_recompute_is_needed_in_the_exactness_cases(profile):
    """Guard: the limits chosen above do force recompute (otherwise the test above proves little)."""
    model = ModelSpec(**{**SMALL.__dict__, "num_layers": 6})
    shape = TrainingShape(seq_len=2048, global_batch=4)
    cm = CostModel(model, shape, Layout(pp=2, micro_batch=1, sharding="none"), ClusterSpec(num_gpus=2), profile)
    limit = _limits(cm, 6, 4)[0]
    _, stages = _brute_force(cm, 6, 4, limit)
    assert sum(s.full_recompute_layers + s.selective_recompute_layers for s in stages) > 0


def test_cpsat_reports_infeasible(profile):
    model = ModelSpec(**{**SMALL.__dict__, "num_layers": 6})
    shape = TrainingShape(seq_len=2048, global_batch=4)
    cm = CostModel(model, shape, Layout(pp=2, micro_batch=1, sharding="none"), ClusterSpec(num_gpus=2), profile)
    res = solve_stages(cm, shape, 1024.0, time_limit_s=10.0)
    assert res.stages is None and res.proven_optimal


def _even_split_best(model, shape, cluster, profile, pins=Pins()):
    limit = mem.plan_memory_limit_bytes(cluster)  # the allowance less the default headroom, as the search's
    best = (float("inf"), None)
    for lay in enumerate_layouts(model, shape, cluster, pins):
        if layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node):
            continue
        cm = CostModel(model, shape, lay, cluster, profile)
        for rc in ("none", "selective", "full"):
            pred = cm.predict(even_stages(model.num_layers, lay.pp * lay.vpp, rc))
            if max(pred.memory_gib_per_rank) * mem.GIB <= limit and pred.step_s < best[0]:
                best = (pred.step_s, (lay, rc))
    return best


@pytest.mark.parametrize("gpu,model,shape", [
    ("h200-sxm", ModelSpec(name="m1", family="gpt", num_layers=8, hidden=2048, num_heads=16, num_kv_heads=16, ffn_hidden=8192,
               vocab_size=32768, max_seq_len=2048, default_seq_len=2048, default_global_batch=16,
               tie_embeddings=True), TrainingShape(2048, 16)),
    # 1.9B parameters on 4 GPUs of the 16 GiB 'cpu' kind: memory binds, recompute and sharding matter
    ("cpu", ModelSpec(name="m2", family="llama", num_layers=8, hidden=4096, num_heads=32, num_kv_heads=8, ffn_hidden=14336,
               vocab_size=32768, max_seq_len=4096, default_seq_len=4096, default_global_batch=32), TrainingShape(4096, 32)),
])
def test_search_no_worse_than_any_even_split(profile, gpu, model, shape):
    cluster = ClusterSpec(gpu=gpu, num_gpus=4, gpus_per_node=4)
    best_even, which = _even_split_best(model, shape, cluster, profile)
    res = search(model, shape, cluster, profile, top_k=3)
    assert res.plans
    got = res.plans[0].prediction.step_s
    assert got <= best_even * (1 + 1e-9), (res.plans[0].layout, res.plans[0].stages, which, got, best_even)
    limit = mem.plan_memory_limit_bytes(cluster) / mem.GIB
    for p in res.plans:
        assert max(p.prediction.memory_gib_per_rank) <= limit + 1e-9
    steps = [p.prediction.step_s for p in res.plans]
    assert steps == sorted(steps)


def test_pins_are_honoured(profile):
    model = tiny_model("llama", num_layers=8, num_experts=4, top_k=2)
    shape = TrainingShape(32, 16)
    cluster = ClusterSpec(num_gpus=8, gpus_per_node=8)
    pins = Pins(tp=2, pp=2, ep=2, micro_batch=1, recompute="selective", sharding="optimizer+grads")
    res = search(model, shape, cluster, profile, pins, top_k=3)
    assert res.plans
    for p in res.plans:
        lay = p.layout
        assert (lay.tp, lay.pp, lay.ep, lay.micro_batch, lay.sharding) == (2, 2, 2, 1, "optimizer+grads")
        assert all(s.selective_recompute_layers == s.layers for s in p.stages)
    # pinning everything evaluates exactly that layout
    res = search(model, shape, cluster, profile, Pins(tp=2, pp=2, vpp=2, dp=2, cp=1, ep=1, micro_batch=2,
                                                     sharding="none", recompute="none"), top_k=3)
    # (MoE at EP1 on an H200 replays its step as a CUDA graph: planner/legality.py, cuda_graph_violation)
    assert [p.layout for p in res.plans] == [Layout(tp=2, pp=2, vpp=2, dp=2, cp=1, ep=1, micro_batch=2, sharding="none",
                                                    cuda_graph=True)]


@pytest.mark.parametrize("name,cuda_graph", [("mixtral-8x7b", True), ("mixtral-8x7b", False), ("llama3-70b", True)])
def test_bounds_are_below_every_split_they_bound(profile, name, cuda_graph):
    """The search skips a layout when its compute bound, then its full bound, reaches the k-th best plan, or when
    its memory bound exceeds the limit: the time bounds must lie below the score of any split of that layout, the
    memory bound below its busiest rank (an MoE model at EP > 1 with the host's time in play,
    where the bounds include the host floor and the MoE's exposed host time)."""
    from planner.model import resolve_model
    from planner.bounds import compute_bound_s, time_and_memory_bounds
    from planner.search import greedy_stages

    model = resolve_model(name)
    shape = TrainingShape(4096, 64)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=16, gpus_per_node=8)
    pins = Pins(cuda_graph=cuda_graph)
    limit = mem.plan_memory_limit_bytes(cluster)
    checked = host_bound = need_recompute = fitting = 0
    for lay in enumerate_layouts(model, shape, cluster, pins):
        if layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node):
            continue
        cm = CostModel(model, shape, lay, cluster, profile)
        compute_s = compute_bound_s(cm, shape, pins.recompute)
        time_s, memory_bytes = time_and_memory_bounds(cm, shape, pins.recompute)
        assert compute_s <= time_s * (1 + 1e-12), lay
        # with the memory limit the time bound adds the least recompute that fitting takes: still below every
        # split that fits
        fitting_time_s, _ = time_and_memory_bounds(cm, shape, pins.recompute, limit)
        assert fitting_time_s >= time_s * (1 - 1e-12)
        need_recompute += fitting_time_s > time_s * (1 + 1e-9)
        splits = [even_stages(model.num_layers, lay.pp * lay.vpp, rc) for rc in ("none", "selective", "full")]
        splits += [greedy_stages(cm, shape, limit * 10), greedy_stages(cm, shape, limit)]
        for stages in splits:
            if stages is None:
                continue
            pred = cm.predict(stages, play=False)
            assert time_s <= pred.step_s * (1 + 1e-9), (lay, stages, time_s, pred.step_s)
            assert memory_bytes <= max(pred.memory_gib_per_rank) * mem.GIB * (1 + 1e-9), (lay, stages)
            if max(pred.memory_gib_per_rank) * mem.GIB <= limit:
                assert fitting_time_s <= pred.step_s * (1 + 1e-9), (lay, stages, fitting_time_s, pred.step_s)
                fitting += 1
            host_bound += pred.breakdown_s["host"] > 0
        checked += 1
    assert checked > 100 and fitting > 100 and need_recompute > 10  # the recompute term is exercised
    if model.is_moe:
        assert host_bound > 0  # host-paced splits are among them (eager plans; EP > 1 cannot be captured)


def test_the_same_search_gives_the_same_plans(profile):
    """CP-SAT runs on a work limit, not the clock (planner.search.stages.SOLVE_WORK): a search repeated, here with the
    CPU busy in another thread, returns the same plans, splits included."""
    import threading

    from planner.model import CATALOGUE

    def plans():
        r = search(CATALOGUE["gpt-70b"], TrainingShape(2048, 1024), ClusterSpec(num_gpus=64), profile, Pins())
        return [(p.layout, p.stages, p.prediction.step_s) for p in r.plans]

    first = plans()
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=busy)
    t.start()
    try:
        again = plans()
    finally:
        stop.set()
        t.join()
    assert again == first


def test_least_recompute_cost_lies_between_the_cheapest_rate_and_every_integer_choice(profile):
    """bounds.least_recompute_cost_s, the linear programme's least, against every count of selectively and fully
    recomputed layers that saves enough (brute force): never above any, never below the cheapest rate's figure,
    and above it once selective recompute alone cannot save enough."""
    from planner.bounds import least_recompute_cost_s
    from planner.model import CATALOGUE

    model = CATALOGUE["llama3-70b"]
    cm = CostModel(model, TrainingShape(8192, 64), Layout(tp=2, pp=4, cp=2), ClusterSpec(num_gpus=16), profile)
    acts, L, n = cm.activations, cm.layer, 12
    d_s, d_f = acts.none_bytes - acts.selective_bytes, acts.none_bytes - acts.full_bytes
    cheapest = min(L.selective_recompute_s / d_s, L.full_recompute_s / d_f)
    tighter = 0
    for frac in [0.05 * i for i in range(1, 21)]:
        need = frac * n * d_f
        lp = least_recompute_cost_s(cm, need, n)
        best = min(xs * L.selective_recompute_s + xf * L.full_recompute_s
                   for xs in range(n + 1) for xf in range(n + 1 - xs) if xs * d_s + xf * d_f >= need)
        assert need * cheapest * (1 - 1e-9) <= lp <= best * (1 + 1e-9), (frac, lp, best)
        tighter += lp > need * cheapest * 1.01
    assert tighter > 5
