"""Pipeline schedules (1F1B, interleaved) against a single-process run: loss and gradients, uneven
splits and per-stage recompute; plus the schedule's timeline against the planner's model."""
import pytest

import _launch
from planner.model import tiny_model
from planner.plan import Layout, StagePlan
from runtime.parallel.pipeline import (analytic_bubble_fraction, analytic_step_time, measured_bubble_fraction,
                                       rank_schedule, simulate)

import _pp_common as C


def _cases():
    gpt = tiny_model("gpt")                        # 4 layers, tied embeddings, learned positions
    llama = tiny_model("llama", num_layers=6)      # rotary, GQA, untied
    return [
        # 1F1B, uneven split, stage 0 full recompute, stage 1 selective + none
        ("1f1b uneven gpt", gpt, 1, [StagePlan(1, full_recompute_layers=1), StagePlan(3, selective_recompute_layers=2)]),
        # 1F1B even split, no recompute
        ("1f1b even llama", llama, 1, [StagePlan(3), StagePlan(3)]),
        # interleaved, 2 virtual stages per rank, uneven, mixed recompute
        ("interleaved uneven llama", llama, 2, [StagePlan(2, 1), StagePlan(1, 0, 1), StagePlan(1), StagePlan(2, 0, 2)]),
        # interleaved with tied embeddings (first and last virtual stage on different ranks)
        ("interleaved gpt", gpt, 2, [StagePlan(1), StagePlan(1), StagePlan(1, 1), StagePlan(1)]),
        # interleaved with the p2p overlap off (each send waited for before the next action)
        ("interleaved llama no overlap", llama, 2, [StagePlan(1), StagePlan(2), StagePlan(2), StagePlan(1)]),
    ]


def _worker(rank, world):
    refs = {}
    for tag, spec, vpp, plans in _cases():
        if spec.name + str(spec.num_layers) not in refs:
            refs[spec.name + str(spec.num_layers)] = C.reference(spec)
        lay = Layout(pp=2, vpp=vpp, micro_batch=2, sharding="none", overlap_pp="no overlap" not in tag)
        losses, grads, _ = C.pipelined(spec, lay, plans)
        C.compare(refs[spec.name + str(spec.num_layers)], (losses, grads), f"rank {rank} {tag}")


def test_pp2_1f1b_and_interleaved_match_single_process():
    _launch.run(_worker, 2)


@pytest.mark.parametrize("pp,v,m", [(2, 1, 1), (2, 1, 4), (4, 1, 3), (4, 1, 8), (2, 2, 2), (2, 2, 4),
                                    (4, 2, 8), (4, 3, 4), (3, 2, 6), (8, 2, 16)])
def test_schedule_is_complete_and_matches_model_in_unit_time(pp, v, m):
    ticks, msgs = simulate(pp, v, m)
    for r in range(pp):
        acts = [a for _, a in ticks[r]]
        assert acts == rank_schedule(pp, v, m, r)
        assert sorted((a.kind, a.chunk, a.mb) for a in acts) == sorted(
            (k, c, b) for k in "FB" for c in range(v) for b in range(m))
    # unit time: every chunk's forward and backward take one tick, so t_r = 2v ticks per micro-batch
    span = max(t for tl in ticks for t, _ in tl) + 1
    assert span == analytic_step_time([2 * v] * pp, m, v)
    timelines = [[dict(start=t, end=t + 1) for t, _ in tl] for tl in ticks]
    assert abs(measured_bubble_fraction(timelines) - analytic_bubble_fraction([2 * v] * pp, m, v)) < 1e-12


def test_messages_pair_up():
    ticks, msgs = simulate(4, 2, 8)
    sent = {(k, sc, s, mb) for (_, k, s, sc, d, dc, mb) in msgs}
    assert len(sent) == len(msgs)
    # every activation except the last stage's and every gradient except the first stage's travels once
    assert len(msgs) == 2 * 8 * (4 * 2 - 1)


def _timeline_worker(rank, world):
    from runtime.parallel.pipeline import gather_timeline
    spec = tiny_model("llama")
    lay = Layout(pp=2, vpp=2, micro_batch=2, sharding="none")
    _, _, groups = C.pipelined(spec, lay, [StagePlan(1)] * 4, steps=1)
    tls = gather_timeline(groups)
    assert [len(t) for t in tls] == [2 * 4 * 2] * 2
    for tl in tls:
        assert all(0 <= r["start"] <= r["end"] for r in tl)
    f = measured_bubble_fraction(tls)
    assert 0.0 <= f < 1.0


def test_timeline_is_recorded_and_gathered():
    _launch.run(_timeline_worker, 2)
