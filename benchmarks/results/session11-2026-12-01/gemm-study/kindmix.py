from evaluate import *
import methods as M, collections
st = collections.defaultdict(list)
for s in ['k1','k5','l1','l3']:
    P = load_profile(s); H = load_heldout(s); T = tables(P)
    tab = T['mm']
    for r in H:
        if r['kind'] == 'wgrad': continue
        got = M._line_pts(tab, 0, (r['n'], r['k']), r['m'], 1)
        if not got: continue
        (x0, r0, v0), (x1, r1, v1) = got[0][-1], got[1][0]
        k0 = tab.kind[(v0, r['n'], r['k'])]; k1 = tab.kind[(v1, r['n'], r['k'])]
        lr = math.log(2*r['m']*r['n']*r['k']/r['t']); f = (math.log2(r['m'])-x0)/(x1-x0)
        ratio = math.exp(lr - (r0 + f*(r1-r0)))
        tag = 'match' if k0 == k1 == r['kind'] else ('mismatch' if k0 == k1 else 'mixed')
        st[(r['kind'], tag, r['m'] >= 10240)].append(ratio)
for key in sorted(st): v = np.array(st[key]); print(key, len(v)//4, 'mean ratio %.3f  median |ratio-1| %.3f' % (v.mean(), np.median(np.abs(v-1))))
# grid-internal: lines that have both kinds
tab = load_profile('l1')['mm']; d = collections.defaultdict(set)
for m,n,k,t,kd in tab: d[(n,k)].add(kd)
print('l1 mm m-lines:', len(d), 'with both kinds:', sum(len(v)>1 for v in d.values()))
