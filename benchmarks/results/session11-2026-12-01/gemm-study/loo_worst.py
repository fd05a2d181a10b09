import sys, random
from evaluate import *
s = sys.argv[1]
P = load_profile(s); rng = random.Random(1)
pts = [('mm', p) for p in P['mm']] + [('wgrad', p) for p in P['wgrad']]
pick = rng.sample(pts, 500)
out = []
for tabname, p in pick:
    rest = [q for q in P[tabname] if q is not p]
    T = M.Tab(rest, P['bw'], 0 if tabname == 'mm' else 2)
    e = M.baseline(T, *p[:3]) / p[3] - 1
    # which path
    q = p[:3]; path = 'idw'
    for ax in range(3):
        if T.line_at(ax, tuple(q[j] for j in range(3) if j != ax), q[ax]) is not None: path = 'line%d' % ax; break
    out.append((abs(e), e, p, path))
out.sort(reverse=True)
for a, e, p, path in out[:25]:
    print(f"{e*100:7.1f}% {p[4]:5s} {p[0]:7d} {p[1]:6d} {p[2]:6d} t={p[3]*1e6:8.1f}us {path}")
import collections
c = collections.Counter(x[3] for x in out); print(c)
for path in c:
    v = np.array([x[0] for x in out if x[3]==path and x[2][3]>=50e-6]); 
    if len(v): print(path, 'n>=50us', len(v), 'med %.3f max %.3f >15%% %d' % (np.median(v), v.max(), (v>0.15).sum()))
