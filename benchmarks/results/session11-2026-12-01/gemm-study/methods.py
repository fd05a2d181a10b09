"""Candidate GEMM-time predictors. Each returns device time (s), no launch adder."""
import math, bisect
import numpy as np
from collections import defaultdict

SMS = 132

class Tab:
    def __init__(self, points, bw, token_axis):
        # points: (m,n,k,t,kind)
        self.bw = bw
        self.token_axis = token_axis
        self.exact = {}
        self.kind = {}
        for p in points:
            self.exact[(p[0], p[1], p[2])] = p[3]
            self.kind[(p[0], p[1], p[2])] = p[4] if len(p) > 4 else '?'
        keys = list(self.exact)
        arr = np.array([(m, n, k, self.exact[(m, n, k)]) for m, n, k in keys], dtype=float)
        self.keys = keys
        self.log_shape = np.log2(arr[:, :3])
        self.log_rate = np.log(2 * arr[:, 0] * arr[:, 1] * arr[:, 2] / arr[:, 3])
        self.lines = defaultdict(list)   # (axis, other dims) -> sorted [(log2 x, log rate, x)]
        for i, (m, n, k) in enumerate(keys):
            d = (m, n, k)
            for ax in range(3):
                rest = tuple(d[j] for j in range(3) if j != ax)
                self.lines[(ax, rest)].append((math.log2(d[ax]), self.log_rate[i], d[ax]))
        for v in self.lines.values():
            v.sort()
        # per axis: map from the other two dims (log2) to line keys, for nearest-line search
        self.line_keys = {ax: [key for key in self.lines if key[0] == ax] for ax in range(3)}
        self.line_pos = {ax: np.log2(np.array([key[1] for key in self.line_keys[ax]], dtype=float))
                         for ax in range(3)}

    def line_at(self, ax, rest, x, allow_extrap=False):
        L = self.lines.get((ax, rest))
        if not L:
            return None
        lx = math.log2(x)
        xs = [p[0] for p in L]
        i = bisect.bisect_left(xs, lx)
        if i < len(L) and abs(L[i][0] - lx) < 1e-12:
            return L[i][1]
        if 0 < i < len(L):
            (x0, r0, _), (x1, r1, _) = L[i - 1], L[i]
            return r0 + (lx - x0) / (x1 - x0) * (r1 - r0)
        return None


def t_mem(tab, m, n, k):
    return 2.0 * (m * k + k * n + m * n) / tab.bw


def baseline(tab, m, n, k):
    flops = 2.0 * m * n * k
    ex = tab.exact.get((m, n, k))
    if ex is not None:
        return ex
    q = (m, n, k)
    for ax in range(3):
        r = tab.line_at(ax, tuple(q[j] for j in range(3) if j != ax), q[ax])
        if r is not None:
            return max(flops / math.exp(r), t_mem(tab, m, n, k))
    d2 = ((tab.log_shape - np.log2([m, n, k])) ** 2).sum(axis=1)
    near = np.argsort(d2)[:4]
    w = 1.0 / np.maximum(d2[near], 1e-12)
    rate = float(np.exp((w * tab.log_rate[near]).sum() / w.sum()))
    return max(flops / rate, t_mem(tab, m, n, k))


def lines2d(tab, m, n, k, nlines=6, power=2.0, fit='idw', clamp=True, axis_first=None):
    """Exact, else interpolation along a bracketing line (token axis first), else: estimate the query's
    token coordinate on each nearby line (lines along the token axis that bracket it), then combine those
    estimates over the other two dims (IDW or clamped local plane)."""
    flops = 2.0 * m * n * k
    ex = tab.exact.get((m, n, k))
    if ex is not None:
        return ex
    q = (m, n, k)
    tax = tab.token_axis
    order = [tax] + [a for a in range(3) if a != tax]
    for ax in order:
        r = tab.line_at(ax, tuple(q[j] for j in range(3) if j != ax), q[ax])
        if r is not None:
            return max(flops / math.exp(r), t_mem(tab, m, n, k))
    best = None
    for ax in order:
        others = [j for j in range(3) if j != ax]
        pos = tab.line_pos[ax]
        if len(pos) == 0:
            continue
        qo = np.log2([q[j] for j in others])
        d2 = ((pos - qo) ** 2).sum(axis=1)
        idx = np.argsort(d2)
        ests = []
        for i in idx[:200]:
            key = tab.line_keys[ax][i]
            r = tab.line_at(ax, key[1], q[ax])
            if r is not None:
                ests.append((d2[i], r, pos[i]))
                if len(ests) >= nlines:
                    break
        if len(ests) >= 2:
            best = (ax, ests, qo)
            break
    if best is None:
        return baseline(tab, m, n, k)
    ax, ests, qo = best
    d2 = np.array([e[0] for e in ests]); r = np.array([e[1] for e in ests]); P = np.array([e[2] for e in ests])
    w = 1.0 / np.maximum(d2, 1e-9) ** (power / 2)
    est = float((w * r).sum() / w.sum())
    if fit == 'plane' and len(ests) >= 4:
        X = np.c_[np.ones(len(P)), P - qo]
        W = np.sqrt(w / w.max())
        A = X * W[:, None]
        coef = np.linalg.solve(A.T @ A + 1e-3 * np.diag([0, 1, 1]), A.T @ (r * W))
        est = float(coef[0])
    if clamp:
        est = min(max(est, r.min()), r.max())
    return max(flops / math.exp(est), t_mem(tab, m, n, k))


TILES = [None, (128, 128), (128, 256), (256, 128), (64, 128), (128, 64), (256, 256), (64, 256)]


def wave_eff(m, n, tile):
    """fraction of the issued tile-work that is useful: tile fill x last-wave fill (132 SMs)."""
    if tile is None:
        return 1.0
    tm, tn = tile
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    waves = math.ceil(tiles / SMS)
    return (m * n) / (waves * SMS * tm * tn)


def _line_pts(tab, ax, rest, x, width=2):
    L = tab.lines.get((ax, rest))
    if not L:
        return None
    lx = math.log2(x)
    lo = [p for p in L if p[0] < lx - 1e-12]
    hi = [p for p in L if p[0] > lx + 1e-12]
    if not lo or not hi:
        return None
    return lo[-width:], hi[:width]


def tilefit(tab, m, n, k, pessimistic=False):
    """On a bracketing token-axis line: for each candidate tile, divide the neighbours' rates by its
    wave efficiency; pick the tile whose normalised rates are flattest over the 2+2 nearest line points
    (least squares of a line through them); interpolate the normalised log rate and multiply back."""
    flops = 2.0 * m * n * k
    ex = tab.exact.get((m, n, k))
    if ex is not None:
        return ex
    q = (m, n, k)
    tax = tab.token_axis
    order = [tax] + [a for a in range(3) if a != tax]
    for ax in order:
        rest = tuple(q[j] for j in range(3) if j != ax)
        got = _line_pts(tab, ax, rest, q[ax])
        if got is None:
            continue
        lo, hi = got
        pts = lo + hi
        # the output dims of this table's GEMM (m,n) in the table's coordinates
        def mn_of(x):
            d = list(q); d[ax] = x
            return d[0], d[1]
        best = None
        for tile in TILES:
            xs = np.array([p[0] for p in pts]); ys = np.array([p[1] - math.log(wave_eff(*mn_of(p[2]), tile)) for p in pts])
            if len(pts) >= 3:
                A = np.c_[np.ones(len(xs)), xs]
                coef, res, *_ = np.linalg.lstsq(A, ys, rcond=None)
                sse = float(((A @ coef - ys) ** 2).sum())
            else:
                sse = 0.0
            if best is None or sse < best[0] - 1e-9:
                best = (sse, tile)
        tile = best[1]
        (x0, r0, v0), (x1, r1, v1) = lo[-1], hi[0]
        r0 -= math.log(wave_eff(*mn_of(v0), tile)); r1 -= math.log(wave_eff(*mn_of(v1), tile))
        lx = math.log2(q[ax])
        r = r0 + (lx - x0) / (x1 - x0) * (r1 - r0)
        if pessimistic:
            r = min(r0, r1)
        r += math.log(wave_eff(q[0], q[1], tile))
        return max(flops / math.exp(r), t_mem(tab, m, n, k))
    return baseline(tab, m, n, k)


def minline(tab, m, n, k):
    """bracketing line: the slower neighbour's rate (pessimistic); else baseline"""
    flops = 2.0 * m * n * k
    ex = tab.exact.get((m, n, k))
    if ex is not None:
        return ex
    q = (m, n, k)
    tax = tab.token_axis
    for ax in [tax] + [a for a in range(3) if a != tax]:
        got = _line_pts(tab, ax, tuple(q[j] for j in range(3) if j != ax), q[ax], 1)
        if got:
            r = min(got[0][-1][1], got[1][0][1])
            return max(flops / math.exp(r), t_mem(tab, m, n, k))
    return baseline(tab, m, n, k)
