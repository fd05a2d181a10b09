"""Final report: every candidate, unchanged, on all four held-out sets and on leave-one-out over 500 grid points."""
import functools
from evaluate import *
cands = {'base(current)': M.baseline, 'lines2d': M.lines2d, 'tilefit': M.tilefit, 'minline': M.minline}
for name, fn in cands.items():
    for s in ['k1', 'k5', 'l1', 'l3']:
        e, H = heldout_errs(fn, s)
        print(summarize(e, H, f'{name:13s} {s} HO  '))
    for s in ['l1', 'l3']:
        e, rows = loo_errs(fn, s)
        print(summarize(e, rows, f'{name:13s} {s} LOO '))
