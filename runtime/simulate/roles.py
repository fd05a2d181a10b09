"""Which ranks of a plan to simulate: by default one rank of each distinct role.

Ranks of one pipeline rank differ only in which shard they hold (TP, CP, DP, EP coordinates), not in its size,
so one of each pipeline rank covers every stage, the embedding's (first) and the output layer's (last); with
expert parallelism one more, the last expert-parallel rank of the first stage (its own experts, its own
expert-data-parallel group)."""
from __future__ import annotations

from planner.errors import PlanError
from planner.plan import Layout


def rank_of(lay: Layout, pp_rank: int = 0, dp_cp_index: int = 0, tp_rank: int = 0) -> int:
    """The global rank at these coordinates (runtime/mesh.py's order: tp fastest, then cp, dp, pp)."""
    return tp_rank + lay.tp * (dp_cp_index + lay.dp * lay.cp * pp_rank)


def default_ranks(lay: Layout) -> list[int]:
    ranks = [rank_of(lay, p) for p in range(lay.pp)]
    if lay.ep > 1:
        ranks.append(rank_of(lay, 0, lay.ep - 1))
    return sorted(dict.fromkeys(ranks))


def parse_ranks(text: str | None, lay: Layout) -> list[int]:
    """--ranks: None (the default roles), 'all', or a comma-separated list of global ranks."""
    if text is None:
        return default_ranks(lay)
    if text == "all":
        return list(range(lay.world_size))
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"--ranks takes 'all' or a comma-separated list of ranks, got '{text}'") from None
    bad = [r for r in ranks if not 0 <= r < lay.world_size]
    if bad or not ranks:
        raise PlanError(f"--ranks: rank {bad[0] if bad else text!r} is not in the plan's world of {lay.world_size}")
    return sorted(dict.fromkeys(ranks))
