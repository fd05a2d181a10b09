import time
from evaluate import *
import methods as M
P = load_profile('l1'); H = load_heldout('l1'); T = tables(P)
for name, fn in [('base', M.baseline), ('lines2d', M.lines2d), ('tilefit', M.tilefit)]:
    t0 = time.perf_counter(); N = 0
    for _ in range(5):
        for r in H:
            fn(T['wgrad' if r['kind']=='wgrad' else 'mm'], r['m'], r['n'], r['k']); N += 1
    print(name, 'uncached us/query: %.1f' % ((time.perf_counter()-t0)/N*1e6))
