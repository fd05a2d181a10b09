import sys, random, time
from common import *
import methods as M

def tables(P):
    return {'mm': M.Tab(P['mm'], P['bw'], 0), 'wgrad': M.Tab(P['wgrad'], P['bw'], 2)}

def heldout_errs(fn, s):
    P = load_profile(s); H = load_heldout(s); T = tables(P)
    errs = [fn(T['wgrad' if r['kind'] == 'wgrad' else 'mm'], r['m'], r['n'], r['k']) / r['t'] - 1 for r in H]
    return errs, H

def loo_errs(fn, s, n=500, seed=1, min_t=0):
    P = load_profile(s)
    rng = random.Random(seed)
    pts = [('mm', p) for p in P['mm']] + [('wgrad', p) for p in P['wgrad']]
    pts = [x for x in pts if x[1][3] >= min_t]
    pick = rng.sample(pts, n)
    errs, rows = [], []
    for tabname, p in pick:
        rest = [q for q in P[tabname] if q is not p]
        T = M.Tab(rest, P['bw'], 0 if tabname == 'mm' else 2)
        pred = fn(T, p[0], p[1], p[2])
        errs.append(pred / p[3] - 1)
        rows.append(dict(kind=p[4], t=p[3]))
    return errs, rows

if __name__ == '__main__':
    import functools
    cands = {
        'base': M.baseline,
        'lines2d_idw': M.lines2d,
        'lines2d_plane': functools.partial(M.lines2d, fit='plane'),
    }
    sets = sys.argv[1].split(',')
    for name, fn in cands.items():
        for s in sets:
            e, H = heldout_errs(fn, s)
            print(summarize(e, H, f'{name:14s} {s} HO  '))
        if '--loo' in sys.argv:
            e, rows = loo_errs(fn, sets[0])
            print(summarize(e, rows, f'{name:14s} {sets[0]} LOO '))
