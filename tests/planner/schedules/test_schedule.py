"""The pipeline schedule's play (planner/schedule.py) against hand-computed spans, its closed form and a play
of every micro-batch."""
import random

import pytest

from planner.schedule import _play, closed_form_s, pipeline_time_s, rank_schedule


@pytest.mark.parametrize("pp,v,m", [(2, 1, 1), (2, 1, 8), (4, 1, 16), (2, 2, 2), (2, 2, 8), (4, 2, 8),
                                    (4, 4, 32), (8, 2, 64), (2, 8, 8)])
def test_equal_stages_and_free_hops_give_the_closed_form(pp, v, m):
    fwd, bwd = [1.0] * (pp * v), [2.0] * (pp * v)
    assert pipeline_time_s(pp, v, m, fwd, bwd) == pytest.approx(closed_form_s([3.0 * v] * pp, m, v))


def test_two_stages_one_micro_batch_by_hand():
    # F0, hop, F1, B1, hop, B0: each hop waits in full
    assert pipeline_time_s(2, 1, 1, [1.0, 0.5], [2.0, 1.5], hop_s=0.25) == pytest.approx(1 + .25 + .5 + 1.5 + .25 + 2)


def test_1f1b_steady_state_is_paced_by_the_slow_stage():
    # stage 1 takes 3 per micro-batch, stage 0 takes 1.5: m micro-batches cost 3 m plus the fill and drain
    span = pipeline_time_s(2, 1, 20, [0.5, 1.0], [1.0, 2.0])
    assert span == pytest.approx(0.5 + 20 * 3.0 + 1.0)


def test_hops_only_lengthen_the_step():
    fwd, bwd = [1.0, 0.8, 1.2, 0.9], [2.0, 1.7, 2.5, 1.9]
    spans = [pipeline_time_s(2, 2, 8, fwd, bwd, h) for h in (0.0, 0.1, 0.3, 1.0)]
    assert spans == sorted(spans) and spans[-1] > spans[0]


def test_extension_beyond_the_played_micro_batches_matches_a_full_play():
    rng = random.Random(0)
    worst = 0.0
    for _ in range(60):
        pp, v = rng.choice([2, 4, 8]), rng.choice([1, 2, 3])
        m = pp * rng.randint(5, 12)
        fwd = [rng.uniform(0.5, 1.5) for _ in range(pp * v)]
        bwd = [2 * f * rng.uniform(0.8, 1.2) for f in fwd]
        hop = rng.choice([0.0, 0.1, 0.5])
        full = _play(pp, v, m, tuple(fwd), tuple(bwd), hop)
        worst = max(worst, abs(pipeline_time_s(pp, v, m, fwd, bwd, hop) / full - 1))
    assert worst < 0.005


def test_every_action_is_scheduled_once():
    for pp, v, m in [(2, 1, 4), (4, 2, 8), (2, 3, 6)]:
        for r in range(pp):
            acts = rank_schedule(pp, v, m, r)
            assert len(acts) == 2 * m * v
            assert len({(a.kind, a.chunk, a.mb) for a in acts}) == 2 * m * v


def test_bad_input():
    with pytest.raises(ValueError, match="divisible"):
        rank_schedule(2, 2, 3, 0)
    with pytest.raises(ValueError, match="stage durations"):
        pipeline_time_s(2, 2, 4, [1.0] * 3, [1.0] * 4)

