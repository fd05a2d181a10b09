"""Activation memory of (interleaved) 1F1B from the micro-batches a rank's chunks hold at once: the memory model
against a plain walk of the action order the runtime plays (planner.schedule.rank_schedule, which
runtime/parallel/pipeline.py imports and runs), for every PP in 2..16 and virtual stages in 1..8."""
from __future__ import annotations

import random

import pytest

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.model import tiny_model
from planner.plan import Layout, StagePlan, TrainingShape
from planner.schedule import rank_schedule


def _walk_peak(p, v, m, r, weights):
    """The most bytes rank r holds at once: each forward of chunk c adds weights[c], its backward frees them."""
    held = [0] * v
    peak = 0
    for a in rank_schedule(p, v, m, r):
        held[a.chunk] += 1 if a.kind == "F" else -1
        assert held[a.chunk] >= 0
        peak = max(peak, sum(h * w for h, w in zip(held, weights)))
    assert held == [0] * v
    return peak


def _micro_batch_counts(p, v):
    """m == pp, a few multiples of pp, and one well past the point where the steady state repeats
    (interleaved needs a multiple of pp; 1F1B also takes fewer micro-batches than ranks)."""
    counts = [p, 2 * p, 3 * p, 12 * p]
    if v == 1:
        counts += [1, max(p - 1, 1), p + 1]
    return counts


@pytest.mark.parametrize("p", range(2, 17))
def test_peak_equals_the_walk_of_the_order(p):
    rng = random.Random(p)
    for v in range(1, 9):
        for m in _micro_batch_counts(p, v):
            lay = Layout(pp=p, vpp=v)
            for r in range(p):
                peaks = mem.in_flight_peaks(r, lay, m)
                # equal bytes per chunk: the most micro-batches held at once
                assert max(map(sum, peaks)) == _walk_peak(p, v, m, r, [1] * v), (p, v, m, r)
                # unequal bytes per chunk (uneven splits, recompute, embedding or head on a chunk)
                w = [rng.randint(1, 1000) for _ in range(v)]
                assert mem.peak_in_flight_bytes(peaks, w) == _walk_peak(p, v, m, r, w), (p, v, m, r, w)


@pytest.mark.parametrize("p,v,m,held,per_chunk_sum", [
    (4, 5, 8, 23, 31),    # rank 0 of PP4 with 5 virtual stages
    (4, 5, 32, 23, 31),
    (8, 6, 16, 55, 72),   # rank 0 of PP8 with 6 virtual stages
    (8, 6, 64, 55, 72),
    (4, 2, 8, 11, 12),
])
def test_rank0_holds_fewer_than_the_chunks_maxima_add_up_to(p, v, m, held, per_chunk_sum):
    lay = Layout(pp=p, vpp=v)
    assert max(map(sum, mem.in_flight_peaks(0, lay, m))) == held
    assert sum(mem.in_flight_by_chunk(0, lay, m)) == per_chunk_sum


def test_peak_vectors_by_hand():
    """PP4, 2 virtual stages, 8 micro-batches, rank 0: 10 warm-up forwards on chunks 0,0,0,0,1,1,1,1,0,0 hold
    (6, 4); then F(chunk 0) -> (7, 4), B(chunk 1) -> (7, 3), F(chunk 0) -> (8, 3), B(chunk 1) -> (8, 2), and
    from there the forwards and backwards of chunk 1 alternate (8, 3) <-> (8, 2) until the backwards reach chunk 0:
    (7, 4) and (8, 3) are the moments that can be the peak; chunk 0's 8 and chunk 1's 4 never coincide. The last
    rank runs 4 warm-up forwards of chunk 0, then F, B of chunk 1 four times, then chunk 0's fifth: (5, 0) or
    (4, 1)."""
    lay = Layout(pp=4, vpp=2)
    assert sorted(mem.in_flight_peaks(0, lay, 8)) == [(7, 4), (8, 3)]
    assert sorted(mem.in_flight_peaks(3, lay, 8)) == [(4, 1), (5, 0)]
    # m == pp: every forward is warm-up, every chunk holds every micro-batch
    assert mem.in_flight_peaks(0, lay, 4) == ((4, 4),)
    # 1F1B: rank r holds pp - r (never more than there are micro-batches)
    assert [mem.in_flight_peaks(r, Layout(pp=4), 8) for r in range(4)] == [((4,),), ((3,),), ((2,),), ((1,),)]
    assert mem.in_flight_peaks(0, Layout(pp=4), 2) == ((2,),)


def test_rank_memory_counts_the_chunks_at_the_same_moment():
    """An uneven split on PP4 x 2 virtual stages, rank 0 (8 micro-batches): chunk 0 holds 3 layers and the
    embedding, chunk 1 one layer. Its activations are the larger of 7 a_0 + 4 a_1 and 8 a_0 + 3 a_1 (the
    moments above), not 8 a_0 + 4 a_1."""
    model = tiny_model("gpt", num_layers=12)
    lay = Layout(pp=4, vpp=2, micro_batch=2, sharding="none")
    cm = CostModel(model, TrainingShape(32, 16), lay, ClusterSpec(gpu="cpu", num_gpus=4, gpus_per_node=4), None)
    stages = [(0, StagePlan(3)), (4, StagePlan(1))]
    static, (a0, a1) = cm.rank_memory_parts(stages)
    assert a0 > a1 > 0
    assert cm.rank_memory_bytes(0, stages, 8) == pytest.approx(static + max(7 * a0 + 4 * a1, 8 * a0 + 3 * a1))
    # and the linear terms the split search uses give the same
    terms = cm.memory_terms(0, 8)
    assert terms.bytes([3, 1], [0, 0], [0, 0]) == pytest.approx(cm.rank_memory_bytes(0, stages, 8))
