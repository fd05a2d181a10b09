"""Global ridge regression of log rate on shape features, fitted on the grid only (sanity check of idea 4)."""
from evaluate import *
import methods as M
def feats(m, n, k):
    lm, ln, lk = np.log2(m), np.log2(n), np.log2(k)
    f = [1, lm, ln, lk, lm*lm, ln*ln, lk*lk, lm*ln, lm*lk, ln*lk]
    for tile in [(128,128),(128,256),(256,128)]:
        f.append(np.log(M.wave_eff(n, m, tile)))   # cuBLAS sees (M=n, N=m)
    ai = 2*m*n*k/(2*(m*k+n*k+m*n)); f.append(np.log(ai)); f.append(np.log(ai)**2)
    f += [np.log2(min(m,n,k)), np.log2(min(m,n,k))**2]
    return f
def fit(points):
    X = np.array([feats(m,n,k) for m,n,k,t,*_ in points]); y = np.array([np.log(2*m*n*k/t) for m,n,k,t,*_ in points])
    w = np.array([1.0 if t>=50e-6 else 0.3 for m,n,k,t,*_ in points])
    A = X*np.sqrt(w)[:,None]
    return np.linalg.solve(A.T@A + 1e-3*np.eye(X.shape[1]), A.T@(y*np.sqrt(w)))
for s in ['k1','k5']:
    P = load_profile(s); H = load_heldout(s)
    C = {'mm': fit(P['mm']), 'wgrad': fit(P['wgrad'])}
    errs = []
    for r in H:
        c = C['wgrad' if r['kind']=='wgrad' else 'mm']
        rate = np.exp(np.dot(feats(r['m'],r['n'],r['k']), c))
        errs.append((2*r['m']*r['n']*r['k']/rate)/r['t']-1)
    print(summarize(errs, H, f'ridge {s} HO '))
    # in-sample fit quality
    for tb in ['mm','wgrad']:
        e = [np.exp(np.log(2*m*n*k/t) - np.dot(feats(m,n,k), C[tb]))-1 for m,n,k,t,*_ in P[tb] if t>=50e-6]
        print('   in-sample', tb, '>=50us median %.3f' % np.median(np.abs(e)))
