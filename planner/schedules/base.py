"""PipelineSchedule: one pipeline schedule stated once, as the planner and the runtime read it.

A schedule is an order of forward and backward actions per pipeline rank (`order`, `actions`). From that order
alone this class derives what the planner needs: the micro-batches each chunk holds at each moment that can be the
rank's memory peak (`in_flight_peaks`) and the span of a step played with real durations (`play_s`). A schedule
with a closed form states it (`closed_form_s`, `objective_weights`, `lower_bound_s`) and may replace the generic
derivations with faster ones; the runtime executes `actions` (runtime/parallel/pipeline.py) when `runs_on_ours`.

Placement: virtual stage j (of V = pp * v, in model order) lives on rank j % pp as its chunk j // pp, unless a
schedule says otherwise (`rank_chunks`, `rank_of_stage`).

The play: every rank runs its actions in order; an action starts when its rank is free and its inputs exist (a
forward needs the previous stage's forward of its micro-batch, a backward its own forward and the next stage's
backward), an input made on another rank arriving `hop_s` after its producer finished (the point-to-point transfer
and the synchronisation around it). A step of m micro-batches is played for m_sim = SIM_MICRO_BATCHES_PER_RANK * pp
micro-batches and for m_sim + pp, and extended linearly beyond (the steady state repeats every pp micro-batches;
the extension is within 0.5% of playing every micro-batch in tests/planner/test_schedule.py), so a plan with 512
micro-batches costs about what one with 16 does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable


SIM_MICRO_BATCHES_PER_RANK = 6
"""A step is played for this many micro-batches per pipeline rank, and one round more, then extended."""

FORWARD, BACKWARD = 0, 1


def num_micro_batches(shape, layout) -> int:
    """Micro-batches per step on each data-parallel rank of a TrainingShape and Layout (planner/plan.py): global
    batch / (micro-batch x DP). Here, below planner.plan and planner.legality, so both use this one definition."""
    return shape.global_batch // (layout.micro_batch * layout.dp)


@dataclass(frozen=True)
class Action:
    kind: str   # "F" or "B"
    chunk: int  # this rank's chunk; virtual stage rank_chunks(pp, v, rank)[chunk]
    mb: int


class PipelineSchedule:
    """A pipeline schedule. Subclasses set `name` and implement `order`; the rest has generic defaults.

    Attributes:
        name: the name a plan's layout carries (Layout.schedule) and the registry knows it by.
        runs_on_ours: whether runtime/parallel/pipeline.py executes this schedule.
        refusal: the sentence the runtime refuses a schedule it does not run with.
        micro_batch_share: the share of the step's micro-batches each of a rank's stages runs (1.0; DualPipe's
            two stages per rank each run half).
        mirrored_stages: ranks r and pp - 1 - r hold the same two stages (the greedy split balances stage pairs).
        fill_drain_bound_holds: every play meets fill_drain_bound_s (planner/bounds.py's whole-layer bound rests
            on it).
    """

    name: str = ""
    runs_on_ours: bool = True
    refusal: str = ""
    micro_batch_share: float = 1.0
    mirrored_stages: bool = False
    fill_drain_bound_holds: bool = True

    # -- the layout it admits and where stages live ----------------------------------------------------------
    def violation(self, pp: int, v: int, m: int) -> str | None:
        """Why this schedule cannot run pp ranks of v chunks over m micro-batches, as a sentence; None if it can."""
        return None

    def rank_chunks(self, pp: int, v: int, rank: int) -> list[int]:
        """The virtual stages rank `rank` holds, in chunk order."""
        return list(range(rank, pp * v, pp))

    def rank_of_stage(self, pp: int, j: int) -> int:
        """The rank that holds virtual stage j."""
        return j % pp

    # -- the action order ---------------------------------------------------------------------------------------
    def order(self, pp: int, v: int, m: int, rank: int) -> list[tuple[int, int, int]]:
        """Rank `rank`'s actions in order, as (kind: FORWARD / BACKWARD, chunk, micro-batch) tuples (the play builds
        tens of thousands of them for a deep pipeline, and tuples are lighter than Actions)."""
        raise NotImplementedError(f"the pipeline schedule {self.name!r} states no action order")

    def actions(self, pp: int, v: int, m: int, rank: int) -> list[Action]:
        """Rank `rank`'s actions in order: what the runtime executes and the planner plays."""
        return [Action("FB"[kind], chunk, mb) for kind, chunk, mb in self.order(pp, v, m, rank)]

    # -- memory ---------------------------------------------------------------------------------------------
    def in_flight_peaks(self, pp: int, v: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
        """The micro-batches each of the rank's chunks holds at once, at every moment that can be the rank's memory
        peak: a forward of chunk c adds one micro-batch's saved tensors to c, its backward frees them, so the
        vectors after each forward are the candidates, and of those only the ones no other vector is at least as
        large as in every chunk can be the peak for some bytes per chunk (memory.peak_in_flight_bytes)."""
        return _walked_peaks(self, pp, v, m, rank)

    # -- time -----------------------------------------------------------------------------------------------
    def play_s(self, pp: int, v: int, m: int, fwd_s, bwd_s, hop_s: float = 0.0) -> float:
        """Seconds from the first forward to the last backward of one step: fwd_s[j] / bwd_s[j] one micro-batch's
        forward / backward through virtual stage j (model order); hop_s the delay of an activation or gradient
        between two ranks."""
        if len(fwd_s) != pp * v or len(bwd_s) != pp * v:
            raise ValueError(f"need {pp * v} stage durations, got {len(fwd_s)} and {len(bwd_s)}")
        fwd_s, bwd_s = tuple(fwd_s), tuple(bwd_s)
        m_sim = SIM_MICRO_BATCHES_PER_RANK * pp
        if m <= m_sim + pp:
            return play_exactly_s(self, pp, v, m, fwd_s, bwd_s, hop_s)
        a = play_exactly_s(self, pp, v, m_sim, fwd_s, bwd_s, hop_s)
        b = play_exactly_s(self, pp, v, m_sim + pp, fwd_s, bwd_s, hop_s)
        # the extension is never taken below what any play of m micro-batches must take (fill_drain_bound_s): the
        # search's bounds (planner/bounds.py) rest on it
        return max(b + (b - a) * (m - m_sim - pp) / pp, fill_drain_bound_s(pp, v, m, fwd_s, bwd_s, hop_s))

    def closed_form_s(self, per_rank_s: list[float], m: int, v: int) -> float:
        """The idealised span (free transfers, every chunk the rank's average): m * max t_r + (sum t_r - max t_r)
        / v, the interleaved 1F1B form. The search's order of candidates; not a lower bound of the play."""
        return m * max(per_rank_s) + (sum(per_rank_s) - max(per_rank_s)) / v

    def objective_weights(self, m: int, v: int) -> tuple[int, int, int]:
        """(a, b, scale): the CP-SAT objective a * max_r T_r + b * sum_r T_r in whole numbers, whose value / scale is
        closed_form_s of the per-rank times T_r (planner/search/stages.py)."""
        return m * v - 1, 1, v

    def lower_bound_s(self, pp: int, m: int, total_stage_s: float, least_stage_s: float, hop_s: float) -> float:
        """A lower bound of the pipeline span over every split whose stage times sum to at least total_stage_s, each
        stage at least least_stage_s (pipeline_lower_bound_s)."""
        return pipeline_lower_bound_s(pp, m, total_stage_s, least_stage_s, hop_s)

    def span_s(self, pp: int, v: int, m: int, per_rank_s: list[float],
               stage_split: Callable[[], tuple[list[float], list[float]]], hop_s: float,
               play: bool = True) -> tuple[float, float]:
        """(span, ideal): the pipeline's seconds per step and its closed form with free hops. per_rank_s: each rank's
        forward + backward per micro-batch (its stages' times times micro_batch_share); stage_split(): the
        (forward, backward) seconds of each virtual stage, asked for only when needed. play=False takes the closed
        form plus the hops on the schedule's path (closed_form_hops) instead of playing (the search's scoring)."""
        if pp == 1:
            span = m * max(per_rank_s)
            return span, span
        ideal = self.closed_form_s(per_rank_s, m, v)
        if not play:
            return ideal + closed_form_hops(pp, v, m) * hop_s, ideal
        fwd, bwd = stage_split()
        return self.play_s(pp, v, m, fwd, bwd, hop_s), ideal


# -- the play of an action order ---------------------------------------------------------------------------------

@lru_cache(maxsize=256)
def _program(schedule: PipelineSchedule, pp: int, v: int,
             m: int) -> tuple[tuple[tuple[int, int, bool, int, bool], ...], ...]:
    """Per rank, per action: (key, first dependency's key, whether it is on another rank, second dependency's key,
    whether that one is). Keys index a flat finish-time table: (kind * V + j) * m + mb, so key // m indexes the
    actions' durations (forwards then backwards, by virtual stage); -1: no dependency. Flat tuples, because a
    deep interleaved pipeline plays tens of thousands of actions."""
    V = pp * v
    out = []
    for r in range(pp):
        chunks = schedule.rank_chunks(pp, v, r)
        prog = []
        for kind, chunk, mb in schedule.order(pp, v, m, r):
            j = chunks[chunk]
            if kind == FORWARD:  # after the previous stage's forward of this micro-batch
                prog.append((j * m + mb, (j - 1) * m + mb if j > 0 else -1,
                             j > 0 and schedule.rank_of_stage(pp, j - 1) != r, -1, False))
            else:  # after its own forward and the next stage's backward
                prog.append(((V + j) * m + mb, j * m + mb, False, (V + j + 1) * m + mb if j < V - 1 else -1,
                             j < V - 1 and schedule.rank_of_stage(pp, j + 1) != r))
        out.append(tuple(prog))
    return tuple(out)


def play_exactly_s(schedule: PipelineSchedule, pp: int, v: int, m: int, fwd_s, bwd_s, hop_s: float) -> float:
    """Span of one step with exactly m micro-batches (every action played)."""
    prog = _program(schedule, pp, v, m)
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


def fill_drain_bound_s(pp: int, v: int, m: int, fwd_s, bwd_s, hop_s: float = 0.0) -> float:
    """A lower bound of every play of a schedule on the standard placement whose ranks end on a backward of their
    first chunk: rank r runs its m micro-batches' forwards and backwards one after another (m t_r); its first
    action (a forward on stage r or later) waits for that forward through stages 0..r-1 and r hops, and after its
    last (the backward of a micro-batch on stage r) that backward still crosses stages r-1..0 and r hops. So the
    span is at least max_r (m t_r + sum_{j<r} (fwd_j + bwd_j) + 2 r hop_s)."""
    S = pp * v
    best = prefix = 0.0
    for r in range(pp):
        t_r = sum(fwd_s[j] + bwd_s[j] for j in range(r, S, pp))
        best = max(best, m * t_r + prefix + 2 * r * hop_s)
        prefix += fwd_s[r] + bwd_s[r]
    return best


def closed_form_hops(pp: int, v: int, m: int) -> int:
    """Hops the closed form puts on the pipeline's path: 2 (m v + pp - 1), every chunk of every micro-batch waiting
    for its hop each way, where there are fewer micro-batches than ranks (no other micro-batch's work fills the
    wait); else 2 (pp v + m - 1), the fill and the drain crossing every virtual stage once each way and one hop
    a micro-batch in the steady state, whose other hops lie beside the other micro-batches' chunks. (The played
    schedule of an interleaved pipeline of 96 one-layer chunks on 8 ranks and 16 micro-batches waits 171 hops;
    the first form counts 398 and the second 222.)"""
    return 2 * min(m * v + pp - 1, pp * v + m - 1)


def pipeline_lower_bound_s(pp: int, m: int, total_stage_s: float, least_stage_s: float, hop_s: float) -> float:
    """A lower bound of fill_drain_bound_s over every split whose stage times sum to at least total_stage_s, each
    stage at least least_stage_s: summing m t_r + r (least_stage_s + 2 hop_s) <= span over the pp ranks gives
    span >= m total / pp + (pp - 1) / 2 (least_stage_s + 2 hop_s). (The closed form is no such bound: with uneven
    stages a play can come in under it.)"""
    if pp == 1:
        return m * total_stage_s
    return m * total_stage_s / pp + (pp - 1) / 2 * (least_stage_s + 2 * hop_s)


# -- in-flight micro-batches from the action order ------------------------------------------------------------

def undominated(vectors) -> tuple[tuple[int, ...], ...]:
    """The vectors no other one is at least as large as in every position, largest sum first."""
    keep: list[tuple[int, ...]] = []
    for h in sorted(vectors, key=sum, reverse=True):  # kept unless a kept one is at least as large everywhere
        if not any(all(x >= y for x, y in zip(g, h)) for g in keep):
            keep.append(h)
    return tuple(keep)


@lru_cache(maxsize=4096)
def _walked_peaks(schedule: PipelineSchedule, pp: int, v: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """PipelineSchedule.in_flight_peaks by walking the rank's whole action order."""
    held = [0] * v
    vecs = set()
    for kind, chunk, _ in schedule.order(pp, v, m, rank):
        if kind == FORWARD:
            held[chunk] += 1
            vecs.add(tuple(held))
        else:
            held[chunk] -= 1
    return undominated(vecs)
