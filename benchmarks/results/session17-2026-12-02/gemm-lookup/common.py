"""Shared data loading and a parametrised copy of planner/profile.py's GEMM lookup (session 17 study).

The lookup here reproduces planner.profile._gemm_s_cached exactly when `adjust` is None (checked in study.py):
exact hit, else linear interpolation of log rate along a measured line in log2 of the third dimension, else
inverse-distance weighting of log rate over the 4 nearest points in log2-shape space; capped by moving the
operands once; plus the 5 us launch adder. `adjust(m, n, k)` -> log efficiency: every point's log rate has it
subtracted before interpolating and the query's interpolated log rate has the query's added back.
`leave_out` drops one point (leave-one-out)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
RES = ROOT / "benchmarks" / "results"
BASE_DEV = ROOT / "profiles" / "h200-sxm-calibrated.json"
BASE_REPORT = ROOT / "profiles" / "h200-sxm.json"
DEV_FILES = {"s1": RES / "session16-2026-12-02/s1/h200-sxm-calibrated-gpt27-gpt13.json",
             "s2": RES / "session16-2026-12-02/s2/h200-sxm-calibrated-hf3.json"}
DEV_MODELS = {"s1": ["benchmarks/models/gpt-2.7b/config.json", "gpt-1.3b"],
              "s2": ["benchmarks/models/phi3-mini/config.json", "benchmarks/models/qwen2-7b-8l/config.json",
                     "benchmarks/models/mistral-nemo-12b-8l/config.json"]}
REPORT_FILES = {"q3": RES / "session14-2026-12-02/q3/acc/gemm.csv",
                "q4": RES / "session14-2026-12-02/q4/acc/gemm.csv",
                "r4": RES / "session15-2026-12-02/r4/acc/gemm.csv"}
LAUNCH_S = 5e-6
TABLE_KEY = {"mm": "points", "wgrad": "wgrad_points", "fp8": "fp8_points"}


def load_profile(path):
    d = json.loads(Path(path).read_text())
    tables = {t: {(int(p[0]), int(p[1]), int(p[2])): float(p[3]) for p in d["gemm"].get(key, [])}
              for t, key in TABLE_KEY.items()}
    return d, tables


def dev_cases(name):
    """(m, n, k, kind, table, measured_s) of the points the extended profile adds to the base; kind from
    regenerating the models' shapes (runtime.profiler.shapes.model_gemm_shapes, as extend.py does)."""
    import sys
    sys.path.insert(0, str(ROOT))
    from planner.model import resolve_model
    from runtime.profiler import shapes

    _, base = load_profile(BASE_DEV)
    _, ext = load_profile(DEV_FILES[name])
    kinds = {}
    for mname in DEV_MODELS[name]:
        spec = resolve_model(mname if not mname.startswith("benchmarks") else str(ROOT / mname))
        for g in shapes.model_gemm_shapes(spec, spec.default_seq_len, shapes.gpu_grid_spec(False).tp_degrees,
                                          flops_cap=1.5e13):
            kinds.setdefault(g.key, g.kind)
    out = []
    for table in ("mm", "wgrad"):
        for (m, n, k), t in ext[table].items():
            if (m, n, k) not in base[table]:
                out.append((m, n, k, kinds[(m, n, k, table == "wgrad")], table, t))
    return out


def report_cases(name):
    rows = list(csv.DictReader(open(REPORT_FILES[name])))
    return [(int(r["m"]), int(r["n"]), int(r["k"]), r["kind"], "wgrad" if r["kind"] == "wgrad" else "mm",
             float(r["measured_s"]), float(r["predicted_s"])) for r in rows]


class Table:
    """Measured points of one table, with an optional log-efficiency adjustment applied to every point."""

    def __init__(self, points: dict, copy_bw: float, adjust=None):
        self.points = points
        self.copy_bw = copy_bw
        self.adjust = adjust
        keys = list(points)
        self.keys = keys
        self.index = {key: i for i, key in enumerate(keys)}
        arr = np.array([(m, n, k, points[(m, n, k)]) for m, n, k in keys], dtype=float)
        self.log_shape = np.log2(arr[:, :3])
        rate = np.log(2.0 * arr[:, 0] * arr[:, 1] * arr[:, 2] / arr[:, 3])
        self.adj = np.array([adjust(m, n, k) if adjust else 0.0 for m, n, k in keys])
        self.log_rate = rate - self.adj          # the "ideal" rate, quantization divided out
        self.lines: dict = {}
        for i, (m, n, k) in enumerate(keys):
            for axis, (x, rest) in enumerate(((m, (n, k)), (n, (m, k)), (k, (m, n)))):
                self.lines.setdefault((axis, rest), []).append((math.log2(x), self.log_rate[i], (m, n, k)))
        for v in self.lines.values():
            v.sort()

    def along_line(self, m, n, k, leave_out=None, narrowest=False, max_gap=None):
        """Log rate along a bracketing line: the first axis (m, n, k) with one (the planner's rule), or with
        narrowest=True the line whose bracket is narrowest; none whose bracket spans more than max_gap octaves."""
        best = None
        for axis, (x, rest) in enumerate(((m, (n, k)), (n, (m, k)), (k, (m, n)))):
            line = self.lines.get((axis, rest))
            if not line:
                continue
            line = [p for p in line if p[2] != leave_out]
            if not line:
                continue
            lx = math.log2(x)
            lo = [p for p in line if p[0] <= lx]
            hi = [p for p in line if p[0] >= lx]
            if lo and hi:
                (x0, r0, _), (x1, r1, _) = lo[-1], hi[0]
                if max_gap is not None and x1 - x0 > max_gap:
                    continue
                r = r0 if x1 == x0 else r0 + (lx - x0) / (x1 - x0) * (r1 - r0)
                if not narrowest:
                    return r, "line"
                if best is None or x1 - x0 < best[0]:
                    best = (x1 - x0, r)
        return (best[1], "line") if best else (None, None)

    def idw(self, m, n, k, leave_out=None, nearest=4):
        d2 = ((self.log_shape - np.log2([m, n, k])) ** 2).sum(axis=1)
        if leave_out is not None:
            d2[self.index[leave_out]] = np.inf
        near = np.argsort(d2)[:nearest]
        w = 1.0 / np.maximum(d2[near], 1e-12)
        return float((w * self.log_rate[near]).sum() / w.sum())

    def log_rate_at(self, m, n, k, leave_out=None, fallback=None, **line_opts):
        """(interpolated ideal log rate, path) without the query's adjustment."""
        r, path = self.along_line(m, n, k, leave_out, **line_opts)
        if r is None:
            r = (fallback or Table.idw)(self, m, n, k, leave_out)
            path = "idw"
        return r, path

    def time_s(self, m, n, k, leave_out=None, fallback=None, **line_opts):
        """Predicted device time (without the launch adder) and the path taken."""
        if leave_out is None and (m, n, k) in self.points:
            return self.points[(m, n, k)], "exact"
        r, path = self.log_rate_at(m, n, k, leave_out, fallback, **line_opts)
        if self.adjust:
            r += self.adjust(m, n, k)
        flops = 2.0 * m * n * k
        t_mem = 2.0 * (m * k + k * n + m * n) / self.copy_bw
        return max(flops / math.exp(r), t_mem), path


def stats(errs):
    a = np.abs(np.asarray(errs))
    if len(a) == 0:
        return dict(n=0)
    return dict(n=len(a), med=100 * np.median(a), p95=100 * np.percentile(a, 95), p99=100 * np.percentile(a, 99),
                worst=100 * a.max(), over15=100 * np.mean(a > 0.15), signed_med=100 * np.median(errs))


def fmt(s):
    if s["n"] == 0:
        return "n=0"
    return (f"n={s['n']:5d} med={s['med']:4.1f} p95={s['p95']:5.1f} p99={s['p99']:5.1f} worst={s['worst']:5.1f} "
            f">15%={s['over15']:4.1f}% sgn={s['signed_med']:+5.1f}")
