from common import *
import numpy as np, math, collections
def lineinterp(d, m, n, k, kind):
    # d: dict (m,n,k)->t ; token axis
    if kind == 'wgrad':
        line = sorted((kk, 2*m*n*kk/t) for (mm,nn,kk),t in d.items() if mm==m and nn==n); x = k
    else:
        line = sorted((mm, 2*mm*n*k/t) for (mm,nn,kk),t in d.items() if nn==n and kk==k); x = m
    lo = [p for p in line if p[0] < x]; hi = [p for p in line if p[0] > x]
    if not lo or not hi: return None
    (x0,r0),(x1,r1) = lo[-1],hi[0]
    f = (math.log2(x)-math.log2(x0))/(math.log2(x1)-math.log2(x0))
    return math.exp(math.log(r0)+f*(math.log(r1)-math.log(r0)))
res = collections.defaultdict(dict)
for s in ['k1','k5','l1','l3']:
    P = load_profile(s)
    mm = {(m,n,k):t for m,n,k,t,_ in P['mm']}; wg = {(m,n,k):t for m,n,k,t,_ in P['wgrad']}
    for r in load_heldout(s):
        li = lineinterp(wg if r['kind']=='wgrad' else mm, r['m'], r['n'], r['k'], r['kind'])
        if li: res[(r['m'],r['n'],r['k'],r['kind'])][s] = 2*r['m']*r['n']*r['k']/r['t']/li
by = collections.defaultdict(list)
for key, v in sorted(res.items(), key=lambda kv: (kv[0][3], kv[0][0] if kv[0][3]!='wgrad' else kv[0][2])):
    tok = key[2] if key[3]=='wgrad' else key[0]
    vals = [v.get(s, float('nan')) for s in ['k1','k5','l1','l3']]
    by[(key[3], tok)].append(np.nanmean(vals))
    print(key, ' '.join(f'{x:.3f}' for x in vals))
for k, v in sorted(by.items()): print(k, len(v), 'mean ratio %.3f  min %.3f max %.3f' % (np.mean(v), min(v), max(v)))
