"""Pipeline schedules (1F1B and interleaved 1F1B) and how long one step of them takes with real durations.

The order of actions is the runtime's (runtime/parallel/pipeline.py runs exactly `rank_schedule`), so the
planner times the schedule that runs, not an idealised one. `pipeline_time_s` plays every rank's action list
in order: an action starts when its rank is free and its inputs exist, an input made on another rank
arriving `hop_s` after its producer finished (the point-to-point transfer and the synchronisation around
it). Why not the closed form m * max_r t_r + (sum_r t_r - max_r t_r) / v that the planner used before
2026-11-30: it takes transfers as free and every chunk as the rank's average, and a replayed interleaved
step measured 10-17% slower than it (2x H200, 2026-11-30). The closed form stays as the
search's ranking of candidates; its bounds are fill_drain_bound_s and pipeline_lower_bound_s, which every play
meets.

Cost: a step of m micro-batches is played for m_sim = 6 pp micro-batches and for m_sim + pp, and extended
linearly beyond (the steady state repeats every pp micro-batches; with uneven stages the fill's transient
can last longer, and the extension was within 0.5% of playing every micro-batch in tests/planner/test_schedule.py),
so a plan with 512 micro-batches costs about what one with 16 does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


SIM_MICRO_BATCHES_PER_RANK = 6
"""A step is played for this many micro-batches per pipeline rank, and one round more, then extended."""


@dataclass(frozen=True)
class Action:
    kind: str   # "F" or "B"
    chunk: int  # this rank's chunk; virtual stage j = chunk * pp + rank
    mb: int


def rank_schedule(pp: int, v: int, m: int, rank: int) -> list[Action]:
    """The ordered forward/backward actions of one pipeline rank (Megatron-LM's order).

    v == 1 (1F1B): warm-up of min(pp - rank - 1, m) forwards, then one forward and one backward at a time,
    then the remaining backwards. v > 1 (interleaved, m % pp == 0): the k-th forward runs chunk
    (k mod pp*v) // pp on micro-batch (k // (pp*v)) * pp + k mod pp, the k-th backward the chunks in
    reverse order; warm-up of min(2 (pp - rank - 1) + (v - 1) pp, m v) forwards (all of them when m == pp)."""
    return [Action("FB"[kind], chunk, mb) for kind, chunk, mb in _rank_order(pp, v, m, rank)]


def _rank_order(pp: int, v: int, m: int, rank: int) -> list[tuple[int, int, int]]:
    """rank_schedule as (kind: 0 forward / 1 backward, chunk, micro-batch) tuples: the schedule play builds
    tens of thousands of them for a deep interleaved pipeline, and tuples cost a fifth of Actions."""
    if v > 1 and m % pp:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) divisible by PP {pp}")
    total, group = m * v, pp * v

    def f(k):
        return 0, (k % group) // pp, (k // group) * pp + k % pp

    def b(k):
        return 1, v - 1 - (k % group) // pp, (k // group) * pp + k % pp

    warm = warmup_forwards(pp, v, m, rank)
    acts = [f(k) for k in range(warm)]
    for i in range(total - warm):
        acts.append(f(warm + i))
        acts.append(b(i))
    acts.extend(b(k) for k in range(total - warm, total))
    return acts


def warmup_forwards(pp: int, v: int, m: int, rank: int) -> int:
    """Forwards rank runs before its first backward (the rule of rank_schedule; planner/memory.py counts from it)."""
    if v == 1:
        return min(pp - rank - 1, m)
    if m == pp:
        return m * v
    return min(2 * (pp - rank - 1) + (v - 1) * pp, m * v)


@lru_cache(maxsize=256)
def _program(pp: int, v: int, m: int) -> tuple[tuple[tuple[int, int, bool, int, bool], ...], ...]:
    """Per rank, per action: (key, first dependency's key, whether it is on another rank, second dependency's key,
    whether that one is). Keys index a flat finish-time table: (kind * V + j) * m + mb, so key // m indexes the
    actions' durations (forwards then backwards, by virtual stage); -1: no dependency. Flat tuples, because a
    deep interleaved pipeline plays tens of thousands of actions."""
    V = pp * v
    out = []
    for r in range(pp):
        prog = []
        for kind, chunk, mb in _rank_order(pp, v, m, r):
            j = chunk * pp + r
            if kind == 0:  # after the previous stage's forward of this micro-batch
                prog.append((j * m + mb, (j - 1) * m + mb if j > 0 else -1, (j - 1) % pp != r, -1, False))
            else:  # after its own forward and the next stage's backward
                prog.append(((V + j) * m + mb, j * m + mb, False,
                             (V + j + 1) * m + mb if j < V - 1 else -1, (j + 1) % pp != r))
        out.append(tuple(prog))
    return tuple(out)


def _play(pp: int, v: int, m: int, fwd_s, bwd_s, hop_s: float) -> float:
    """Span of one step with exactly m micro-batches (every action played)."""
    prog = _program(pp, v, m)
    dur = tuple(fwd_s) + tuple(bwd_s)
    finish = [-1.0] * (2 * pp * v * m)
    pos, free = [0] * pp, [0.0] * pp
    left = sum(len(p) for p in prog)
    while left:
        moved = False
        for r in range(pp):
            p, i, n = prog[r], pos[r], len(prog[r])
            start0 = free[r]
            while i < n:
                k, a, a_remote, b, b_remote = p[i]
                start = start0  # the two dependencies written out: this loop runs for every action played
                if a >= 0:
                    t = finish[a]
                    if t < 0:
                        break
                    if a_remote:
                        t += hop_s
                    if t > start:
                        start = t
                if b >= 0:
                    t = finish[b]
                    if t < 0:
                        break
                    if b_remote:
                        t += hop_s
                    if t > start:
                        start = t
                finish[k] = start0 = start + dur[k // m]
                i += 1
                left -= 1
                moved = True
            pos[r], free[r] = i, start0
        if not moved:
            raise RuntimeError("pipeline schedule cannot make progress (deadlock in the action order)")
    return max(free)


def pipeline_time_s(pp: int, v: int, m: int, fwd_s: list[float], bwd_s: list[float], hop_s: float = 0.0) -> float:
    """Seconds from the first forward to the last backward of one step: pp ranks, v chunks per rank, m
    micro-batches; fwd_s[j] / bwd_s[j] one micro-batch's forward / backward through virtual stage j (model
    order, j = chunk * pp + rank); hop_s the delay of an activation or gradient between two ranks."""
    if len(fwd_s) != pp * v or len(bwd_s) != pp * v:
        raise ValueError(f"need {pp * v} stage durations, got {len(fwd_s)} and {len(bwd_s)}")
    fwd_s, bwd_s = tuple(fwd_s), tuple(bwd_s)
    m_sim = SIM_MICRO_BATCHES_PER_RANK * pp
    if m <= m_sim + pp:
        return _play(pp, v, m, fwd_s, bwd_s, hop_s)
    a = _play(pp, v, m_sim, fwd_s, bwd_s, hop_s)
    b = _play(pp, v, m_sim + pp, fwd_s, bwd_s, hop_s)
    # the extension is never taken below what any play of m micro-batches must take (fill_drain_bound_s): the
    # search's bounds (planner/bounds.py) rest on it
    return max(b + (b - a) * (m - m_sim - pp) / pp, fill_drain_bound_s(pp, v, m, fwd_s, bwd_s, hop_s))


def fill_drain_bound_s(pp: int, v: int, m: int, fwd_s, bwd_s, hop_s: float = 0.0) -> float:
    """A lower bound of every play of the schedule (pipeline_time_s) with these stage times: rank r runs its m
    micro-batches' forwards and backwards one after another (m t_r); its first action (the forward of micro-batch
    0 on stage r) waits for that forward through stages 0..r-1 and r hops, and after its last (the backward of
    micro-batch m-1 on stage r: chunk 0, rank_schedule) that backward still crosses stages r-1..0 and r hops.
    So the span is at least max_r (m t_r + sum_{j<r} (fwd_j + bwd_j) + 2 r hop_s)."""
    S = pp * v
    best = prefix = 0.0
    for r in range(pp):
        t_r = sum(fwd_s[j] + bwd_s[j] for j in range(r, S, pp))
        best = max(best, m * t_r + prefix + 2 * r * hop_s)
        prefix += fwd_s[r] + bwd_s[r]
    return best


def pipeline_lower_bound_s(pp: int, m: int, total_stage_s: float, least_stage_s: float, hop_s: float) -> float:
    """A lower bound of fill_drain_bound_s over every split whose stage times sum to at least total_stage_s, each
    stage at least least_stage_s: summing m t_r + r (least_stage_s + 2 hop_s) <= span over the pp ranks gives
    span >= m total / pp + (pp - 1) / 2 (least_stage_s + 2 hop_s). (The closed form, closed_form_s, is no such
    bound: with uneven stages a play can come in under it.)"""
    if pp == 1:
        return m * total_stage_s
    return m * total_stage_s / pp + (pp - 1) / 2 * (least_stage_s + 2 * hop_s)


def closed_form_s(per_rank_s: list[float], m: int, v: int) -> float:
    """The idealised interleaved-1F1B span (free transfers, every chunk the rank's average):
    m * max t_r + (sum t_r - max t_r) / v. The search's order of candidates and the tests' reference; not a lower
    bound of the play (fill_drain_bound_s is)."""
    return m * max(per_rank_s) + (sum(per_rank_s) - max(per_rank_s)) / v
