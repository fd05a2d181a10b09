"""DualPipe (DeepSeek-V3, arXiv 2412.19437 section 3.2.1), as modelled for the megatron target: micro-batches enter
from both ends, rank r holds stage r and stage pp - 1 - r, and each stage runs half the micro-batches. The planner
prices it by its paper's closed form (Table 2); our runtime does not execute it."""
from __future__ import annotations

from planner.schedules.base import PipelineSchedule


class DualPipe(PipelineSchedule):
    """DualPipe: two opposite 1F1B pipelines of half the micro-batches each, modelled only."""

    name = "dualpipe"
    runs_on_ours = False
    refusal = "our runtime does not run the DualPipe schedule (the planner models it for the megatron target only)"
    micro_batch_share = 0.5
    mirrored_stages = True
    fill_drain_bound_holds = False

    def violation(self, pp: int, v: int, m: int) -> str | None:
        """DualPipe needs an even PP >= 2, no interleaving, and an even number of at least PP micro-batches (half
        entering at each end)."""
        if not (pp >= 2 and pp % 2 == 0 and v == 1 and m >= pp and m % 2 == 0):
            return (f"DualPipe needs an even PP of at least 2, VPP 1 and an even number of at least PP micro-batches "
                    f"(PP {pp}, VPP {v}, {m} micro-batches)")
        return None

    def rank_chunks(self, pp: int, v: int, rank: int) -> list[int]:
        return [rank, pp - 1 - rank]

    def rank_of_stage(self, pp: int, j: int) -> int:
        return min(j, pp - 1 - j)

    def order(self, pp: int, v: int, m: int, rank: int) -> list[tuple[int, int, int]]:
        raise NotImplementedError(self.refusal)

    def in_flight_peaks(self, pp: int, v: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
        """Its two opposite 1F1B pipelines of half the micro-batches each at their peaks together, pp - rank and
        rank + 1 (Table 2's "PP+1")."""
        half = m // 2
        return ((min(pp - rank, half), min(rank + 1, half)),)

    def span_s(self, pp, v, m, per_rank_s, stage_split, hop_s, play=True):
        """Table 2: bubble (PP/2 - 1)(F&B + B - 3W) of the slowest rank's chunks: F&B = F + B (the pair's compute
        runs back to back; what overlaps is communication), W, the weight-gradient part of B, taken as half of it
        (a backward's GEMMs split evenly into input and weight gradients); hops hidden. The span is its own ideal."""
        t_max = max(per_rank_s)
        r = per_rank_s.index(t_max)
        fwd, _ = stage_split()
        f = self.micro_batch_share * sum(fwd[j] for j in self.rank_chunks(pp, v, r))
        b = t_max - f
        span = m * t_max + (pp / 2 - 1) * (f + 2 * b - 3 * b / 2)
        return span, span

    def lower_bound_s(self, pp, m, total_stage_s, least_stage_s, hop_s):
        """The busiest rank's work alone, no fill: every rank runs half the micro-batches through each of its two
        stages, m total / pp at least."""
        return m * total_stage_s / pp
