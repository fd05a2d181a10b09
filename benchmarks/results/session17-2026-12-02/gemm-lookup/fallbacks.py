"""Fallbacks for a query on no measured line (Table.log_rate_at(fallback=...)): each returns an ideal log rate."""
import math

import numpy as np


def idw(nearest=4, power=2.0):
    def f(tab, m, n, k, leave_out=None):
        d2 = ((tab.log_shape - np.log2([m, n, k])) ** 2).sum(axis=1)
        if leave_out is not None:
            d2[tab.index[leave_out]] = np.inf
        near = np.argsort(d2)[:nearest]
        w = 1.0 / np.maximum(d2[near], 1e-12) ** (power / 2)
        return float((w * tab.log_rate[near]).sum() / w.sum())
    return f


def plane(nearest=12, ridge=1e-2, clamp=True):
    """Weighted least-squares plane in log2-shape space over the nearest points (weights 1/d^2), clamped to the
    neighbours' range."""
    def f(tab, m, n, k, leave_out=None):
        q = np.log2([m, n, k])
        d2 = ((tab.log_shape - q) ** 2).sum(axis=1)
        if leave_out is not None:
            d2[tab.index[leave_out]] = np.inf
        near = np.argsort(d2)[:nearest]
        w = 1.0 / np.maximum(d2[near], 1e-12)
        X = np.c_[np.ones(len(near)), tab.log_shape[near] - q]
        r = tab.log_rate[near]
        W = np.sqrt(w / w.max())
        A = X * W[:, None]
        coef = np.linalg.solve(A.T @ A + ridge * np.diag([0, 1, 1, 1]), A.T @ (r * W))
        est = float(coef[0])
        if clamp:
            est = min(max(est, r.min()), r.max())
        return est
    return f


def _line_index(tab):
    """Per axis: arrays of the lines' other two log2 coordinates and their keys (cached on the table)."""
    if getattr(tab, "_lidx", None) is None:
        idx = {}
        for axis in range(3):
            keys = [key for key, pts in tab.lines.items() if key[0] == axis and len(pts) >= 2]
            pos = np.log2(np.array([key[1] for key in keys], dtype=float)) if keys else np.zeros((0, 2))
            idx[axis] = (keys, pos)
        tab._lidx = idx
    return tab._lidx


def _interp_line(line, lx, leave_out):
    pts = [p for p in line if p[2] != leave_out]
    lo = [p for p in pts if p[0] <= lx]
    hi = [p for p in pts if p[0] >= lx]
    if lo and hi:
        (x0, r0, _), (x1, r1, _) = lo[-1], hi[0]
        return r0 if x1 == x0 else r0 + (lx - x0) / (x1 - x0) * (r1 - r0)
    return None


def lines(nearest=4, power=2.0, axes=(0, 1, 2), clamp_plane=False):
    """Interpolate along every nearby line that brackets the query on its axis (to the query's coordinate),
    then inverse-distance weight those estimates by distance in the other two dimensions; the nearest
    `nearest` over all axes. Else IDW."""
    base = idw()

    def f(tab, m, n, k, leave_out=None):
        q = (m, n, k)
        lq = np.log2(q)
        ests = []
        for axis in axes:
            keys, pos = _line_index(tab)[axis]
            if not keys:
                continue
            other = [j for j in range(3) if j != axis]
            d2 = ((pos - lq[other]) ** 2).sum(axis=1)
            got = 0
            for i in np.argsort(d2)[:60]:
                r = _interp_line(tab.lines[keys[i]], lq[axis], leave_out)
                if r is not None:
                    ests.append((d2[i], r))
                    got += 1
                    if got >= nearest:
                        break
        if len(ests) < 2:
            return base(tab, m, n, k, leave_out)
        ests.sort()
        ests = ests[:nearest]
        w = np.array([1.0 / max(d, 1e-12) ** (power / 2) for d, _ in ests])
        r = np.array([r for _, r in ests])
        return float((w * r).sum() / w.sum())
    return f
