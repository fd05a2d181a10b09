"""Grouped GEMMs: the MoE experts' projections, each run as one torch._grouped_mm over all of a rank's local experts
(runtime/parallel/expert_mlp.py), priced against a dense GEMM of all their rows.

Why a table of its own: a grouped GEMM of G experts of M rows each is neither one dense GEMM of G x M rows (it
pays per-expert tiles and a ragged last tile) nor G small GEMMs of M rows (it fills the GPU with several experts'
tiles at once). On H200 the forward runs at 1.0-1.2x the dense GEMM of all its rows from 1024 rows per expert
and 2.3-4x at 64, where G separate GEMMs take 6-8x at 256, and the runtime's fp32-accumulating weight gradient at
1.6-2.5x even at 4096-8192 rows (benchmarks/results/grouped-gemm/). So the
profiler (runtime/profiler/grouped.py) times both, grouped and dense, beside each other at the same clock, and
the cost model reads their ratio at the rows per expert a layout gives, times the profile's own dense GEMM of
those rows.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GROUPED_DIRECTIONS = ("fwd", "dgrad", "wgrad")
"""fwd: y = x W_g^T ([M, k] x [k, n] per expert); dgrad: dx = dy W_g ([M, n] x [n, k]); wgrad: dW_g = dy^T x
([n, M] x [M, k], accumulated into the experts' fp32 main gradients, runtime/grouped_wgrad.py)."""


@dataclass(frozen=True)
class GroupedGemmPoint:
    direction: str
    """One of GROUPED_DIRECTIONS."""
    experts: int
    """Local experts in the grouped call (G)."""
    rows: int
    """Rows per expert (M): routed token copies each expert receives."""
    n: int
    """Expert weight's output features (the weight is [n, k], nn.Linear's layout)."""
    k: int
    """Expert weight's input features."""
    grouped_s: float
    """Device time of the grouped call, seconds."""
    dense_s: float
    """Device time of the dense GEMM of all G x M rows in the same direction and layout, timed beside it."""

    @property
    def ratio(self) -> float:
        return self.grouped_s / self.dense_s

    def to_dict(self) -> dict:
        return asdict(self)


def dense_equivalent(direction: str, rows: int, n: int, k: int) -> tuple[str, int, int, int]:
    """(profile GEMM table, m, n, k) of the dense GEMM of `rows` rows that a grouped call is priced against, in
    the profile's keys (runtime/profiler/README.md): forward (tokens, n_out, k_in), dgrad (tokens, k_in, n_out),
    wgrad (n_out, k_in, tokens) in the fp32-accumulating table."""
    if direction == "fwd":
        return "mm", rows, n, k
    if direction == "dgrad":
        return "mm", rows, k, n
    return "wgrad", n, k, rows


def _series(points: tuple[GroupedGemmPoint, ...], direction: str, experts: int, n: int,
            k: int) -> list[tuple[int, float]]:
    """(rows, ratio) of the measured series nearest this call: same direction, the nearest weight shape (log
    distance over n and k), then the nearest expert count (log distance), sorted by rows."""
    pts = [p for p in points if p.direction == direction]
    if not pts:
        return []
    shape = min({(p.n, p.k) for p in pts}, key=lambda s: (abs(math.log(s[0] / n)) + abs(math.log(s[1] / k)), s))
    pts = [p for p in pts if (p.n, p.k) == shape]
    g = min({p.experts for p in pts}, key=lambda e: (abs(math.log(e / experts)), e))
    return sorted((p.rows, p.ratio) for p in pts if p.experts == g)


def grouped_over_dense(points: tuple[GroupedGemmPoint, ...], direction: str, experts: int, rows: int, n: int,
                       k: int) -> tuple[float, int] | None:
    """(ratio of the grouped call's time to the dense GEMM's, the rows per expert that dense GEMM is taken at),
    from the nearest measured series (_series): linear in log2(rows) between the two measured row counts around
    `rows`; above the largest, that one's ratio; below the smallest, the smallest's time (a kernel pads each
    expert to whole tiles, so fewer rows than the smallest measured cost no less: the dense GEMM is then taken
    at the smallest measured rows). None without measured points in that direction."""
    series = _series(points, direction, experts, n, k)
    if not series:
        return None
    if rows <= series[0][0]:
        return series[0][1], series[0][0]
    if rows >= series[-1][0]:
        return series[-1][1], rows
    for (r0, q0), (r1, q1) in zip(series, series[1:]):
        if r0 <= rows <= r1:
            w = (math.log2(rows) - math.log2(r0)) / (math.log2(r1) - math.log2(r0)) if r1 > r0 else 0.0
            return q0 + w * (q1 - q0), rows
    return series[-1][1], rows  # not reached: the series is sorted and rows lies within it
