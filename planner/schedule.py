"""The 1F1B / interleaved 1F1B schedule as functions of (pp, v, m): thin wrappers over the schedule registry
(planner/schedules/), kept for the callers that name the degrees rather than a schedule. v == 1 is 1F1B, v > 1
interleaved 1F1B; both play Megatron-LM's order, the one runtime/parallel/pipeline.py executes."""
from __future__ import annotations

from planner.schedules import INTERLEAVED, ONE_F_ONE_B, PipelineSchedule
from planner.schedules.base import (SIM_MICRO_BATCHES_PER_RANK, Action, fill_drain_bound_s,  # noqa: F401
                                    pipeline_lower_bound_s, play_exactly_s)
from planner.schedules.one_f_one_b import megatron_order, warmup_forwards  # noqa: F401


def megatron_schedule(v: int) -> PipelineSchedule:
    """1F1B for one chunk per rank, interleaved 1F1B for more."""
    return INTERLEAVED if v > 1 else ONE_F_ONE_B


def rank_schedule(pp: int, v: int, m: int, rank: int) -> list[Action]:
    """The ordered forward/backward actions of one pipeline rank (Megatron-LM's order; one_f_one_b.megatron_order)."""
    return megatron_schedule(v).actions(pp, v, m, rank)


def _play(pp: int, v: int, m: int, fwd_s, bwd_s, hop_s: float) -> float:
    """Span of one step with exactly m micro-batches (every action played)."""
    return play_exactly_s(megatron_schedule(v), pp, v, m, fwd_s, bwd_s, hop_s)


def pipeline_time_s(pp: int, v: int, m: int, fwd_s: list[float], bwd_s: list[float], hop_s: float = 0.0) -> float:
    """Seconds from the first forward to the last backward of one step (PipelineSchedule.play_s)."""
    return megatron_schedule(v).play_s(pp, v, m, fwd_s, bwd_s, hop_s)


def closed_form_s(per_rank_s: list[float], m: int, v: int) -> float:
    """The idealised interleaved-1F1B span (free transfers, every chunk the rank's average):
    m * max t_r + (sum t_r - max t_r) / v. The search's order of candidates and the tests' reference; not a lower
    bound of the play (fill_drain_bound_s is)."""
    return megatron_schedule(v).closed_form_s(per_rank_s, m, v)
