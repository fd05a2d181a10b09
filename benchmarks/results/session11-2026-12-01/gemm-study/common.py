import sys, json, csv, math
from functools import lru_cache
import numpy as np
sys.path.insert(0, '/work/main')
R = '/work/main/benchmarks/results/'
SETS = {'k1': 'session6-2026-11-30/k1', 'k5': 'session6-2026-11-30/k5',
        'l1': 'session7-2026-11-30/l1', 'l3': 'session7-2026-11-30/l3',
        'h1': 'session4-2026-11-30/h1', 'h3': 'session4-2026-11-30/h3',
        'j1': 'session5-2026-11-30/j1', 'j2': 'session5-2026-11-30/j2'}

@lru_cache(None)
def kind_map():
    from runtime.profiler import shapes
    g = shapes.gemm_grid(shapes.gpu_grid_spec(False))
    km = {}
    for s in g:
        if s.kind != 'wgrad':
            km[(s.m, s.n, s.k)] = s.kind
    # also old grid spec (tokens up to 131072, no threes?) - same function; fine
    return km

def load_profile(name):
    d = json.load(open(R + SETS[name] + '/h200-sxm.json'))
    km = kind_map()
    mm = [(int(m), int(n), int(k), float(t), km.get((int(m), int(n), int(k)), '?')) for m, n, k, t in d['gemm']['points']]
    wg = [(int(m), int(n), int(k), float(t), 'wgrad') for m, n, k, t in d['gemm']['wgrad_points']]
    return dict(mm=mm, wgrad=wg, bw=float(d['copy_bandwidth_bytes_per_s']), spread=d['extras'].get('gemm_spread'),
                wspread=d['extras'].get('wgrad_spread'))

def load_heldout(name):
    rows = []
    for r in csv.DictReader(open(R + SETS[name] + '/acc/gemm.csv')):
        rows.append(dict(m=int(r['m']), n=int(r['n']), k=int(r['k']), kind=r['kind'], t=float(r['measured_s']),
                         pred=float(r['predicted_s'])))
    return rows

def summarize(errs, rows, label=''):
    a = np.abs(np.array(errs))
    out = {'all': a}
    for kd in ('fwd', 'dgrad', 'wgrad'):
        out[kd] = a[[r['kind'] == kd for r in rows]]
    out['<50us'] = a[[r['t'] < 50e-6 for r in rows]]
    out['>=50us'] = a[[r['t'] >= 50e-6 for r in rows]]
    s = []
    for key, v in out.items():
        if len(v):
            s.append(f"{key}: n={len(v)} med={100*np.median(v):.1f} max={100*v.max():.1f} >15%={int((v>0.15).sum())}")
    return label + ' | '.join(s)
