from common import *
import numpy as np, math, collections, sys
def odd(x):
    while x % 2 == 0: x //= 2
    return x
s = sys.argv[1] if len(sys.argv) > 1 else 'l1'
P = load_profile(s)
for tab in ['mm', 'wgrad']:
    d = {(m,n,k):t for m,n,k,t,_ in P[tab]}
    lines = collections.defaultdict(list)
    for (m,n,k),t in d.items():
        r = math.log(2*m*n*k/t)
        lines[(0,n,k)].append((math.log2(m), r)); lines[(1,m,k)].append((math.log2(n), r)); lines[(2,m,n)].append((math.log2(k), r))
    for v in lines.values(): v.sort()
    stats = collections.defaultdict(list)
    for (m,n,k),t in d.items():
        if t < 50e-6: continue
        r = math.log(2*m*n*k/t)
        for ax, key, x in ((0,(0,n,k),m),(1,(1,m,k),n),(2,(2,m,n),k)):
            L = lines[key]; lx = math.log2(x)
            lo = [p for p in L if p[0] < lx]; hi = [p for p in L if p[0] > lx]
            if lo and hi and hi[0][0]-lo[-1][0] <= 1.01:
                (x0,r0),(x1,r1) = lo[-1],hi[0]
                ri = r0 + (lx-x0)/(x1-x0)*(r1-r0)
                stats[(ax, odd(x))].append(math.exp(r-ri))
    print(tab)
    for key in sorted(stats):
        v = np.array(stats[key])
        if len(v) >= 5: print('  axis', 'mnk'[key[0]], 'odd', key[1], 'n', len(v), 'mean %.3f median %.3f p10 %.3f' % (v.mean(), np.median(v), np.percentile(v,10)))
