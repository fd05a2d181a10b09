"""Interleaved 1F1B: each rank holds v > 1 chunks (virtual stages rank, rank + pp, ...) and runs Megatron-LM's
interleaved order (one_f_one_b.megatron_order), which shrinks the fill and drain by v at the price of v times the
point-to-point hops. It needs the micro-batches to be a multiple of PP."""
from __future__ import annotations

from planner.schedules.one_f_one_b import OneFOneB


class Interleaved(OneFOneB):
    """Interleaved 1F1B over v > 1 chunks per rank; the same order, peaks, play and closed form as OneFOneB."""

    name = "interleaved"

    def violation(self, pp: int, v: int, m: int) -> str | None:
        if v < 2:
            return "the interleaved schedule needs more than one virtual stage per pipeline rank (vpp > 1)"
        if m % pp:
            return f"interleaved schedule needs micro-batches ({m}) divisible by PP {pp}"
        return None
