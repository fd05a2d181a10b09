"""Micro-batches in flight on a pipeline rank, from its schedule's action order (planner/schedules/), and the
bytes they hold at the rank's peak: the in-flight part of the memory model (planner/memory/model.py)."""
from __future__ import annotations

from functools import lru_cache

from planner.plan import Layout
from planner.schedules import schedule_named


def in_flight_micro_batches(rank: int, chunk: int, lay: Layout, num_micro_batches: int) -> int:
    """The most micro-batches a virtual stage (`chunk` of pipeline `rank`) holds at any moment of the step. The
    chunks of one rank reach their maxima at different moments, so their sum over-counts the rank's peak (rank 0
    of PP4 with 5 virtual stages: 31 against 23 held at once); memory uses in_flight_peaks. This per-chunk figure
    only orders chunks in the greedy split (planner/search/stages.py)."""
    return in_flight_by_chunk(rank, lay, num_micro_batches)[chunk]


def in_flight_by_chunk(rank: int, lay: Layout, num_micro_batches: int) -> tuple[int, ...]:
    """in_flight_micro_batches of each of the rank's chunks, at once."""
    peaks = in_flight_peaks(rank, lay, num_micro_batches)
    return tuple(max(h[c] for h in peaks) for c in range(lay.vpp))


def in_flight_peaks(rank: int, lay: Layout, num_micro_batches: int) -> tuple[tuple[int, ...], ...]:
    """The micro-batches each of the rank's chunks holds at once, at every moment that can be the rank's memory peak:
    the layout's schedule's (PipelineSchedule.in_flight_peaks, from the action order the runtime plays). The peak of a
    rank whose chunks keep w_c bytes per micro-batch is max over these vectors h of sum_c h_c w_c
    (peak_in_flight_bytes)."""
    return schedule_named(lay.schedule).in_flight_peaks(lay.pp, lay.vpp, num_micro_batches, rank)


NUMPY_PEAK_TERMS = 256
"""Peak vectors x chunks above which peak_in_flight_bytes sums with numpy (deep interleaved pipelines hold
hundreds of candidate vectors); below it plain Python is faster."""

_OF_PEAKS: dict[tuple[int, str], tuple] = {}
"""(id(peaks), what) -> (peaks, a figure derived from them alone): the schedules' peak tuples are cached objects
that the search asks about for every layout and split, so each figure is worked out once (the tuple is kept with
it, so its id cannot be reused)."""


def _of_peaks(peaks: tuple[tuple[int, ...], ...], what: str, derive):
    hit = _OF_PEAKS.get((id(peaks), what))
    if hit is None or hit[0] is not peaks:
        hit = _OF_PEAKS[(id(peaks), what)] = (peaks, derive(peaks))
    return hit[1]


def _columns(peaks: tuple[tuple[int, ...], ...]) -> tuple:
    import numpy as np
    return tuple(np.array([h[c] for h in peaks], dtype=np.float64) for c in range(len(peaks[0])))


def _peak_columns(peaks: tuple[tuple[int, ...], ...]) -> tuple:
    """One float64 array per chunk: the micro-batches it holds at each peak vector."""
    return _of_peaks(peaks, "columns", _columns)


def chunk_maxima(peaks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The most micro-batches each chunk holds at any of the peak vectors."""
    return _of_peaks(peaks, "chunk maxima", lambda ps: tuple(max(h[c] for h in ps) for c in range(len(ps[0]))))


def scarcest_chunk_peak(peaks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The peak vector whose scarcest chunk holds the most micro-batches (the larger sum on a tie; the first of
    equals): every layer of the rank is held at least min(h) times at that moment (MemoryTermsOfRanks.
    rank_fixed_bytes)."""
    return _of_peaks(peaks, "scarcest chunk", lambda ps: max(ps, key=lambda h: (min(h), sum(h))))


def peak_in_flight_bytes(peaks: tuple[tuple[int, ...], ...], per_micro_batch_bytes) -> float:
    """The largest sum over a rank's chunks of micro-batches held at once times each chunk's bytes per micro-batch.
    Each vector's sum runs chunk by chunk from 0.0 in either path, so both give the same float."""
    w = tuple(per_micro_batch_bytes)
    if len(peaks) * len(w) > NUMPY_PEAK_TERMS:
        cols = _peak_columns(peaks)
        total = 0.0
        for col, wc in zip(cols, w):
            total = total + col * wc
        return float(total.max())
    best = float("-inf")
    for h in peaks:
        t = 0.0
        for k, x in zip(h, w):
            t += k * x
        if t > best:
            best = t
    return best


@lru_cache(maxsize=4096)
def ranks_at_scarcest_peak(schedule, pp: int, vpp: int, num_micro_batches: int) -> tuple:
    """Per pipeline rank of `schedule`: (its virtual stages, the peak vector whose scarcest chunk holds the most
    micro-batches (scarcest_chunk_peak: the rank holds at least what it holds then, every layer counted at least
    min(h) times), whether it holds the first stage (the embedding), whether it holds the last (the head)): what the
    memory bound asks of every layout of this pipeline shape (MemoryTermsOfRanks.rank_fixed_bytes)."""
    S = pp * vpp
    out = []
    for r in range(pp):
        chunks = tuple(schedule.rank_chunks(pp, vpp, r))
        out.append((chunks, scarcest_chunk_peak(schedule.in_flight_peaks(pp, vpp, num_micro_batches, r)),
                    0 in chunks, S - 1 in chunks))
    return tuple(out)
