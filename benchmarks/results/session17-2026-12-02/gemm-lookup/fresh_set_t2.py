# Session 17: the old lookup and the study's candidates on call t2's 600 fresh held-out shapes (never seen by the study),
# and on r4 / q4. Run from the repository root: python benchmarks/results/session17-2026-12-02/gemm-lookup/fresh_set_t2.py
import csv, sys, statistics as st, math
from pathlib import Path
import numpy as np
import planner.profile as pp
from planner.profile import Profile
def idw(self, m, n, k):
    d2 = ((self.log_shape - np.log2([m, n, k])) ** 2).sum(axis=1)
    near = np.argsort(d2)[:4]
    w = 1.0 / np.maximum(d2[near], 1e-12)
    return float((w * self.log_rate[near]).sum() / w.sum())
def run(label, octaves, fallback, files):
    pp.LINE_MAX_BRACKET_OCTAVES = octaves
    pp._GemmTable.plane_log_rate = fallback
    pp._gemm_s_cached.cache_clear()
    for f, prof in files:
        p = Profile.load(Path(prof))
        rows = list(csv.DictReader(open(f)))
        errs = []
        for r in rows:
            m, n, k = int(r['m']), int(r['n']), int(r['k'])
            pred = (p.wgrad_s(m, n, k) if r["kind"] == "wgrad" else p.gemm_s(m, n, k)) - 5e-6
            meas = float(r['measured_s']); errs.append(abs(pred - meas) / meas)
        a = sorted(errs); N = len(a)
        print(f"{label:28s} {f.split('/')[-3]:4s} median {100*st.median(a):.2f} p99 {100*a[int(.99*N)-1]:.1f} worst {100*a[-1]:.1f} >15% {sum(x>.15 for x in a)}/{N}")
plane = pp._GemmTable.plane_log_rate
R='benchmarks/results/'
files=[(R+'session17-2026-12-02/t2/acc/gemm.csv','profiles/h200-sxm.json'),(R+'session15-2026-12-02/r4/acc/gemm.csv','profiles/h200-sxm.json'),(R+'session14-2026-12-02/q4/acc/gemm.csv','profiles/h200-sxm.json')]
run("old", float('inf'), idw, files)
run("2-octave + idw", 2.0, idw, files)
run("plane only", float('inf'), plane, files)
run("both (I5)", 2.0, plane, files)
