"""Look-ups between measured points: a GEMM's rate interpolated in log-shape space (along a measured line of the
grid, else a plane fitted to the nearest points), a collective's fit for a group size, and the fit itself."""
from __future__ import annotations

import math
from functools import lru_cache

from planner.errors import PlanError
from planner.profile.records import CollectiveFit, bus_factor


LINE_MAX_BRACKET_OCTAVES = 2.0
"""A GEMM is interpolated along a measured line only where the line's points either side of it are at most this
many octaves apart (a factor of 4). Over a wider bracket the rate's curve is far from straight in log2: 512 x 3072 x
2304 reads 42% slow between n = 768 and 16384 in a study of the lookup on measured H200 shapes (the lookup's
leave-one-out accuracy: benchmarks/results/gemm-interpolation/)."""

PLANE_NEAREST_POINTS = 20
"""How many measured shapes nearest in log2 shape the off-line fallback fits its plane to."""

PLANE_SLOPE_RIDGE = 1e-2
"""Ridge on the fitted plane's three slopes (weights normalised to at most 1): keeps the fit solvable when the
nearest points span fewer than three dimensions."""


class _GemmTable:
    """Measured GEMMs as arrays of log2 shapes and log achieved rates, for nearest-neighbour lookups."""

    def __init__(self, points: tuple, copy_bw: float):
        import numpy as np

        arr = np.array([(m, n, k, t) for m, n, k, t in points], dtype=float)
        self.log_shape = np.log2(arr[:, :3])
        self.log_rate = np.log(2.0 * arr[:, 0] * arr[:, 1] * arr[:, 2] / arr[:, 3])
        self.exact = {(int(m), int(n), int(k)): t for m, n, k, t in points}
        self.copy_bw = copy_bw
        # lines through the grid: the points sharing two dimensions, sorted along the third
        self.lines: dict = {}
        for (m, n, k), t in self.exact.items():
            rate = math.log(2.0 * m * n * k / t)
            for axis, (x, rest) in enumerate(((m, (n, k)), (n, (m, k)), (k, (m, n)))):
                self.lines.setdefault((axis, rest), []).append((math.log2(x), rate))
        for v in self.lines.values():
            v.sort()

    def along_line(self, m: int, n: int, k: int) -> float | None:
        """Log rate interpolated along a measured line (two dimensions equal to the query's), linear in
        log2 of the third; None when no line brackets the query within LINE_MAX_BRACKET_OCTAVES."""
        for axis, (x, rest) in enumerate(((m, (n, k)), (n, (m, k)), (k, (m, n)))):
            line = self.lines.get((axis, rest))
            if not line:
                continue
            lx = math.log2(x)
            lo = [p for p in line if p[0] <= lx]
            hi = [p for p in line if p[0] >= lx]
            if lo and hi:
                (x0, r0), (x1, r1) = lo[-1], hi[0]
                if x1 - x0 > LINE_MAX_BRACKET_OCTAVES:
                    continue
                return r0 if x1 == x0 else r0 + (lx - x0) / (x1 - x0) * (r1 - r0)
        return None

    def plane_log_rate(self, m: int, n: int, k: int) -> float:
        """Log rate at a shape on no usable line: a plane in log2 shape fitted by weighted least squares to the
        PLANE_NEAREST_POINTS nearest measured shapes (weights 1 / squared distance), clamped to the range of
        their rates so that it never extrapolates past them. It follows the rate's slope where inverse-distance
        weights over the 4 nearest average it away. With the two-octave line rule, over 8,335 off-grid shapes
        measured on H200, the plane brings the share missing by more than 15% from 2.4% (inverse-distance
        weights) to 1.3%, the 99th percentile from 17.7% to 15.6%, the median from 3.1% to 2.9%
        (the lookup's leave-one-out accuracy: benchmarks/results/gemm-interpolation/)."""
        import numpy as np

        query = np.log2([m, n, k])
        dist2 = ((self.log_shape - query) ** 2).sum(axis=1)
        count = min(PLANE_NEAREST_POINTS, len(dist2))
        near = np.argpartition(dist2, count - 1)[:count]
        sqrt_weight = np.sqrt(1.0 / np.maximum(dist2[near], 1e-12))
        sqrt_weight /= sqrt_weight.max()
        offsets = self.log_shape[near] - query              # the plane's value at the query is its intercept
        design = np.c_[np.ones(count), offsets] * sqrt_weight[:, None]
        rates = self.log_rate[near]
        ridge = np.diag([0.0, PLANE_SLOPE_RIDGE, PLANE_SLOPE_RIDGE, PLANE_SLOPE_RIDGE])
        intercept = np.linalg.solve(design.T @ design + ridge, design.T @ (rates * sqrt_weight))[0]
        return float(min(max(intercept, rates.min()), rates.max()))


GEMM_LAUNCH_S = 5e-6
"""Fixed time per GEMM beside its interpolated device time, for steps issued eagerly (Profile.gemm_launch_s)."""


@lru_cache(maxsize=200_000)
def _gemm_s_cached(table: _GemmTable, m: int, n: int, k: int) -> float:
    """A GEMM's device time from the table (its measured point, else interpolated); Profile adds the fixed term."""
    flops = 2.0 * m * n * k
    t_mem = 2.0 * (m * k + k * n + m * n) / table.copy_bw  # a GEMM cannot beat moving its operands once
    exact = table.exact.get((m, n, k))
    if exact is not None:
        return exact
    log_rate = table.along_line(m, n, k)
    if log_rate is None:
        log_rate = table.plane_log_rate(m, n, k)
    return max(flops / math.exp(log_rate), t_mem)


@lru_cache(maxsize=4096)
def _collective_lookup(pid: int, fits: tuple, op: str, group_size: int, link: str) -> CollectiveFit:
    exact = [c for c in fits if c.op == op and c.link == link and c.group_size == group_size]
    if exact:
        return exact[0]
    same = [c for c in fits if c.op == op and c.link == link]
    if not same:
        same = [c for c in fits if c.op == op]
    if not same:
        raise PlanError(f"the profile has no figure for {op} over {link}")
    # model another group size from the nearest measured one: same bus bandwidth (ring / NVSwitch: each GPU
    # drives its own links), latency growing with the ring's (n-1) steps
    base = min(same, key=lambda c: abs(math.log2(c.group_size / group_size)))
    steps = max(group_size - 1, 1) / max(base.group_size - 1, 1)
    return CollectiveFit(op=op, link=link, group_size=group_size, latency_s=base.latency_s * steps,
                         bus_bandwidth_bytes_per_s=base.bus_bandwidth_bytes_per_s, measured=False,
                         fill_ratio=base.fill_ratio, fill_s=base.fill_s * steps)


def fit_collective(points: list[tuple[float, float]], op: str, group_size: int, link: str,
                   measured: bool = True) -> CollectiveFit:
    """Least-squares fit of time = latency + bytes * factor / busbw, weighted by 1/time so that small and
    large messages count alike (relative error). Needs at least two sizes."""
    f = bus_factor(op, group_size)
    xs = [b * f for b, _ in points]
    ts = [t for _, t in points]
    # weighted least squares on t = a + c*x with weights 1/t^2
    w = [1.0 / (t * t) for t in ts]
    sw = sum(w); swx = sum(wi * x for wi, x in zip(w, xs)); swt = sum(wi * t for wi, t in zip(w, ts))
    swxx = sum(wi * x * x for wi, x in zip(w, xs)); swxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * swxx - swx * swx
    if det <= 0:
        raise PlanError(f"cannot fit {op}: need at least two distinct message sizes")
    c = (sw * swxt - swx * swt) / det
    a = (swt - c * swx) / sw
    a = max(a, 0.0)
    c = max(c, 1e-15)
    return CollectiveFit(op=op, link=link, group_size=group_size, latency_s=a, bus_bandwidth_bytes_per_s=1.0 / c,
                         measured=measured, points=tuple((float(b), float(t)) for b, t in points))
