"""How far each held-out point's measured rate lies outside its grid neighbours' rates: the least error any
predictor that stays within the neighbours' range (any interpolation / convex weighting) must make."""
from evaluate import *
import methods as M
for s in ['k1', 'k5', 'l1', 'l3']:
    P = load_profile(s); H = load_heldout(s); T = tables(P)
    lb_line, lb_knn, base_e = [], [], []
    nb = 0
    for r in H:
        tab = T['wgrad' if r['kind'] == 'wgrad' else 'mm']
        m, n, k = r['m'], r['n'], r['k']; q = (m, n, k)
        lr = math.log(2 * m * n * k / r['t'])
        # neighbours along the first bracketing line (the lookup's own neighbours), else the 4 IDW ones
        nbr = None
        for ax in [tab.token_axis] + [a for a in range(3) if a != tab.token_axis]:
            got = M._line_pts(tab, ax, tuple(q[j] for j in range(3) if j != ax), q[ax], 1)
            if got:
                nbr = [got[0][-1][1], got[1][0][1]]; nb += 1; break
        d2 = ((tab.log_shape - np.log2([m, n, k])) ** 2).sum(axis=1)
        near8 = tab.log_rate[np.argsort(d2)[:8]]
        if nbr is None:
            nbr = list(tab.log_rate[np.argsort(d2)[:4]])
        def lb(rates):
            lo, hi = min(rates), max(rates)
            if lr < lo: return math.exp(lr - lo) - 1   # pred slower-rate bound: pred time/meas -1 = r/rate_lo -1
            if lr > hi: return math.exp(lr - hi) - 1
            return 0.0
        # time error = meas_rate/pred_rate - 1
        lb_line.append(lb(nbr)); lb_knn.append(lb(list(near8)))
    a = np.abs(lb_line); b = np.abs(lb_knn)
    big = np.array([r['t'] >= 50e-6 for r in H])
    print(f"{s}: bracketed {nb}/150 | outside lookup-neighbour range: {int((a>0).sum())} (>5%: {int((a>0.05).sum())}, >15%: {int((a>0.15).sum())}); "
          f"least possible error: median {100*np.median(a):.1f}% worst {100*a.max():.1f}% | "
          f"vs 8 nearest: outside {int((b>0).sum())}, >15%: {int((b>0.15).sum())}, median {100*np.median(b):.1f}% worst {100*b.max():.1f}%"
          f" | >=50us only (lookup nbrs): >15% {int((a[big]>0.15).sum())} worst {100*a[big].max():.1f}%")
