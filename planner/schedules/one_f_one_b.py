"""1F1B (one forward, one backward): each rank runs a warm-up of forwards, then alternates one forward and one
backward, then drains the remaining backwards (Megatron-LM's non-interleaved schedule). Its action order is
Megatron's interleaved order with one chunk per rank (`megatron_order`), which interleaved.py shares."""
from __future__ import annotations

from functools import lru_cache

from planner.schedules.base import BACKWARD, FORWARD, PipelineSchedule, undominated


def warmup_forwards(pp: int, v: int, m: int, rank: int) -> int:
    """Forwards rank runs before its first backward: min(pp - rank - 1, m) with one chunk per rank;
    min(2 (pp - rank - 1) + (v - 1) pp, m v) with v chunks (all of them when m == pp)."""
    if v == 1:
        return min(pp - rank - 1, m)
    if m == pp:
        return m * v
    return min(2 * (pp - rank - 1) + (v - 1) * pp, m * v)


def megatron_order(pp: int, v: int, m: int, rank: int) -> list[tuple[int, int, int]]:
    """Megatron-LM's order for rank `rank` as (kind, chunk, micro-batch) tuples: the k-th forward runs chunk
    (k mod pp*v) // pp on micro-batch (k // (pp*v)) * pp + k mod pp, the k-th backward the chunks in reverse order;
    warmup_forwards forwards first, then one forward and one backward at a time, then the remaining backwards."""
    if v > 1 and m % pp:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) divisible by PP {pp}")
    total, group = m * v, pp * v

    def f(k):
        return FORWARD, (k % group) // pp, (k // group) * pp + k % pp

    def b(k):
        return BACKWARD, v - 1 - (k % group) // pp, (k // group) * pp + k % pp

    warm = warmup_forwards(pp, v, m, rank)
    acts = [f(k) for k in range(warm)]
    for i in range(total - warm):
        acts.append(f(warm + i))
        acts.append(b(i))
    acts.extend(b(k) for k in range(total - warm, total))
    return acts


def _micro_batch_cap(p: int, v: int) -> int:
    """Micro-batches beyond which a rank's held vectors repeat: rank r's k-th forward and backward run chunks
    periodic in k (period p*v, p micro-batches per chunk each period), so after the warm-up (at most
    2 (p - 1) + (v - 1) p forwards) the vectors after each steady-state forward repeat every p*v of them, and the
    cool-down runs no forward. A multiple of p (the interleaved schedule needs one)."""
    if v == 1:
        return p
    need = -(-(2 * (p - 1) + (2 * v - 1) * p) // v)
    return -(-need // p) * p


@lru_cache(maxsize=65536)
def _megatron_peaks(p: int, v: int, rank: int, m: int) -> tuple[tuple[int, ...], ...]:
    """The walk of megatron_order(p, v, m, rank), cut short (tests/planner/memory/test_interleaved_memory.py walks the
    whole order itself): the k-th forward runs chunk (k mod p*v) // p, the k-th backward chunk v - 1 - (k mod p*v) // p.
    The warm-up only adds, so of its vectors only its last can be a peak (among the first W forwards chunk c ran
    p (W // (p*v)) + clip(W mod p*v - c p, 0, p)); then the vector after each steady-state forward, which repeat
    every p*v steps; the cool-down only frees."""
    total, group = m * v, p * v
    warm = warmup_forwards(p, v, m, rank)

    held = [p * (warm // group) + min(max(warm % group - c * p, 0), p) for c in range(v)]
    vecs = {tuple(held)} if warm else set()
    for b in range(min(total - warm, group)):  # the steady state repeats every p*v steps
        held[((warm + b) % group) // p] += 1            # forward W + b
        vecs.add(tuple(held))
        held[v - 1 - (b % group) // p] -= 1             # backward b
    return undominated(vecs)


@lru_cache(maxsize=65536)
def megatron_peaks(p: int, v: int, rank: int, m: int) -> tuple[tuple[int, ...], ...]:
    """The in-flight peaks of megatron_order, its micro-batches capped where the vectors start to repeat."""
    return _megatron_peaks(p, v, rank, min(m, _micro_batch_cap(p, v)))


class OneFOneB(PipelineSchedule):
    """1F1B: one chunk per rank, Megatron-LM's warm-up / steady / cool-down order."""

    name = "1f1b"

    def violation(self, pp: int, v: int, m: int) -> str | None:
        if v != 1:
            return f"the 1F1B schedule runs one chunk per pipeline rank, not VPP {v} (the interleaved schedule does)"
        return None

    def order(self, pp: int, v: int, m: int, rank: int) -> list[tuple[int, int, int]]:
        return megatron_order(pp, v, m, rank)

    def in_flight_peaks(self, pp: int, v: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
        """The walk of the action order in closed form (megatron_peaks)."""
        return megatron_peaks(pp, v, rank, m)
