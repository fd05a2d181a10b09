import sys, functools
from evaluate import *
cands = {'base': M.baseline, 'tilefit': M.tilefit, 'minline': M.minline}
sets = sys.argv[1].split(',')
for name, fn in cands.items():
    for s in sets:
        e, H = heldout_errs(fn, s)
        print(summarize(e, H, f'{name:10s} {s} HO  '))
    if '--loo' in sys.argv:
        e, rows = loo_errs(fn, sets[0], min_t=0)
        print(summarize(e, rows, f'{name:10s} {sets[0]} LOO '))
