from common import *
from baseline import Table, baseline
import sys
s = sys.argv[1]
P = load_profile(s); H = load_heldout(s)
def rate(m,n,k,t): return 2*m*n*k/t/1e12
mmd = {(m,n,k):(t,kd) for m,n,k,t,kd in P['mm']}
wgd = {(m,n,k):(t,kd) for m,n,k,t,kd in P['wgrad']}
outside = 0; nb = 0
for r in sorted(H, key=lambda r:(r['kind'], r['n'], r['k'], r['m'])):
    m,n,k,kd = r['m'], r['n'], r['k'], r['kind']
    rm = rate(m,n,k,r['t'])
    if kd == 'wgrad':
        line = sorted((kk, rate(mm,nn,kk,t)) for (mm,nn,kk),(t,_) in wgd.items() if mm==m and nn==n); x = k
    else:
        line = sorted((mm, rate(mm,nn,kk,t), kk2) for (mm,nn,kk),(t,kk2) in mmd.items() if nn==n and kk==k); x = m
    lo = [p for p in line if p[0] < x]; hi = [p for p in line if p[0] > x]
    br = ''
    if lo and hi:
        nb += 1
        a, b = lo[-1][1], hi[0][1]
        out = rm < min(a,b)*0.97 or rm > max(a,b)*1.03
        outside += out
        br = f"lo {lo[-1][0]}:{a:.0f}{'/'+lo[-1][2] if kd!='wgrad' else ''} hi {hi[0][0]}:{b:.0f}{'/'+hi[0][2] if kd!='wgrad' else ''} {'OUT' if out else ''}"
    else:
        br = f'no bracket; line has {len(line)} pts'
    print(f"{kd:5s} {m:6d} {n:6d} {k:6d} t={r['t']*1e6:8.1f}us rate={rm:5.0f} err={100*(r['pred']/r['t']-1):6.1f}%  {br}")
print('bracketed', nb, 'outside(3% margin)', outside)
