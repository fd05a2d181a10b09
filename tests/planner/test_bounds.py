"""planner/bounds.py's score bound (closed_form_bound_s) against the score of every split tried, layout by layout."""
from __future__ import annotations

import pytest

from planner import memory as mem
from planner.bounds import closed_form_bound_s, time_bound_s
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.cost.targets import RuntimeTarget
from planner.legality import layout_violation
from planner.model import resolve_model
from planner.plan import TrainingShape, even_stages
from planner.search import Pins, enumerate_layouts, greedy_stages
from planner.search.stages import stages_with_layer_counts


def _splits(cm, shape, limit, recompute):
    """Even splits in each recompute mode the pin allows, the greedy split, and the greedy split with one layer moved
    from each stage to the next or the previous (recomputing what each rank must to fit): uneven splits too."""
    modes = [recompute] if recompute else ["none", "selective", "full"]
    out = [even_stages(cm.m.num_layers, cm.lay.pp * cm.lay.vpp, rc) for rc in modes]
    greedy = greedy_stages(cm, shape, limit, recompute)
    if greedy is None:
        return out
    out.append(greedy)
    counts = [st.layers for st in greedy]
    for j in range(len(counts)):
        for k in (j - 1, j + 1):
            if 0 <= k < len(counts) and counts[j] > 1:
                moved = counts[:]
                moved[j] -= 1
                moved[k] += 1
                split = stages_with_layer_counts(cm, shape, limit, moved, recompute)
                if split is not None:
                    out.append(split)
    return out


@pytest.mark.parametrize("name,gpus,recompute,cuda_graph", [
    ("llama3-70b", 16, None, True),          # memory-tight: most splits recompute
    ("mixtral-8x7b", 16, None, False),       # eager MoE: host-paced stages, EP's exposed host time
    ("llama3-70b", 16, "selective", True),   # a pinned recompute mode
])
def test_score_bound_is_below_every_fitting_split(profile, name, gpus, recompute, cuda_graph):
    """The search leaves a layout unsplit when its score bound exceeds the k-th best score (scoring._score): the
    bound must lie below the score (CostModel.predict(play=False)) of every split of the layout that fits. It is
    also tighter than the time bound on many layouts (the hops every micro-batch pays, the recompute the busiest
    rank needs), or it would prune nothing."""
    model = resolve_model(name)
    shape = TrainingShape(4096, 64)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=gpus, gpus_per_node=8)
    pins = Pins(cuda_graph=cuda_graph, recompute=recompute)
    limit = mem.plan_memory_limit_bytes(cluster)
    checked = fitting = tighter = recompute_counted = 0
    for i, lay in enumerate(enumerate_layouts(model, shape, cluster, pins)):
        if i % 3 or layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node):
            continue
        cm = CostModel(model, shape, lay, cluster, profile)
        bound_s = closed_form_bound_s(cm, recompute, limit)
        assert bound_s >= closed_form_bound_s(cm, recompute) * (1 - 1e-12)  # the limit only adds recompute
        recompute_counted += bound_s > closed_form_bound_s(cm, recompute) * (1 + 1e-6)
        tighter += bound_s > time_bound_s(cm, shape, recompute, limit) * (1 + 1e-6)
        for stages in _splits(cm, shape, limit, recompute):
            pred = cm.predict(stages, play=False)
            if max(pred.memory_gib_per_rank) * mem.GIB > limit:
                continue
            assert bound_s <= pred.step_s * (1 + 1e-9), (lay, stages, bound_s, pred.step_s)
            fitting += 1
        checked += 1
    assert checked > 100 and fitting > 100
    assert tighter > checked // 4
    if recompute is None:
        assert recompute_counted > 10  # the busiest rank's least recompute is exercised


@pytest.mark.parametrize("pp", [1, 2])
def test_score_bound_by_hand(profile, pp):
    """A dense model replayed as a CUDA graph (GPU-paced, no host floor), no memory limit (no recompute): with one
    rank the bound is m times the whole step's stage time (no hops); with two it is the closed form at the least
    largest rank over every split into whole layers (found here by trying each), its two hops included, against
    the mean."""
    model = resolve_model("llama3-8b")
    shape = TrainingShape(4096, 64)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=8)
    lay = next(enumerate_layouts(model, shape, cluster, Pins(tp=8 // pp, pp=pp, vpp=1, micro_batch=1, cp=1,
                                                             sharding="optimizer" if pp == 1 else None,
                                                             cuda_graph=True)))
    cm = CostModel(model, shape, lay, cluster, profile)
    assert lay.cuda_graph and cm.lay.pp == pp
    m, L, layer_s, ends = cm.num_micro, model.num_layers, cm.layer.fwd_bwd_s, cm.ends
    head_s = ends.head_s + ends.head_comm_s
    total = L * layer_s + ends.embedding_s + head_s
    if pp == 1:
        expected = m * total
    else:
        busiest = min(max(n * layer_s + ends.embedding_s, (L - n) * layer_s + head_s) for n in range(1, L))
        hops = 2 * cm.p2p_s
        largest = max(busiest + hops, (total + 2 * hops) / 2)
        expected = m * largest + (total + 2 * hops - largest)
    assert closed_form_bound_s(cm) == pytest.approx(expected, rel=1e-12)
    even = even_stages(L, pp)
    assert closed_form_bound_s(cm) <= cm.predict(even, play=False).step_s


def test_no_score_bound_for_dual_pipe(profile):
    """DualPipe prices its own span (each rank runs half the micro-batches through two stages), not the generic
    closed form the bound rests on: no bound (0.0), so the search splits every such layout it reaches."""
    model = resolve_model("mixtral-8x7b")
    shape = TrainingShape(4096, 64)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=16, gpus_per_node=8)
    target = RuntimeTarget("dual", dual_pipe=True)
    limit = mem.plan_memory_limit_bytes(cluster)
    dual = 0
    for lay in enumerate_layouts(model, shape, cluster, Pins(pp=4, vpp=1)):
        if layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node):
            continue
        cm = CostModel(model, shape, lay, cluster, profile, target=target)
        if cm.dual_pipe:
            assert closed_form_bound_s(cm, None, limit) == 0.0
            dual += 1
    assert dual > 0


@pytest.mark.parametrize("name,gpus", [("llama3-405b", 1024), ("mixtral-8x7b", 64)])
def test_whole_layers_bound_from_its_start_is_the_bound_layer_by_layer(profile, monkeypatch, name, gpus):
    """whole_layers_bound_s starts each rank at counts below the least largest span (_counts_below_least_largest)
    instead of at vpp layers: the same bound to the last bit, GPU- or host-paced, with MoE's exposed host time."""
    from planner import bounds

    model = resolve_model(name)
    shape = TrainingShape(model.default_seq_len, model.default_global_batch)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=gpus, gpus_per_node=8)
    started = 0
    for i, lay in enumerate(enumerate_layouts(model, shape, cluster, Pins(cuda_graph=False))):
        if i % 7 or layout_violation(model, shape, lay, cluster.num_gpus, cluster.gpus_per_node):
            continue
        cm = CostModel(model, shape, lay, cluster, profile)
        g = cm.layer.fwd_bwd_s
        for gpu_s, host_s, exposed_s in ((g, 0.0, 0.0), (g, 1.3 * g, 0.01 * g), (2 * g, 0.7 * g, 0.0)):
            start = bounds._counts_below_least_largest
            from_start = bounds.whole_layers_bound_s(cm, cm.num_micro, gpu_s, host_s, exposed_s)
            monkeypatch.setattr(bounds, "_counts_below_least_largest", lambda *args: None)
            layer_by_layer = bounds.whole_layers_bound_s(cm, cm.num_micro, gpu_s, host_s, exposed_s)
            monkeypatch.setattr(bounds, "_counts_below_least_largest", start)
            assert from_start == layer_by_layer, (lay, gpu_s, host_s, exposed_s)
            started += 1
    assert started > 300
