"""One line per plan of `plan --why-not --json` outputs, and their expert-parallel rows up to EP 16:
    python benchmarks/results/moe-ep/summarise_plans.py PLAN.json ..."""
import json, sys
def lay(l):
    s = f"TP{l['tp']} PP{l['pp']}" + (f"x{l['vpp']}v" if l['vpp'] > 1 else "") + f" DP{l['dp']}"
    s += f" CP{l['cp']}" if l['cp'] > 1 else ""
    s += f" EP{l['ep']}" if l['ep'] > 1 else ""
    s += f" mb{l['micro_batch']} {l['sharding']}" + (" graph" if l['cuda_graph'] else "") + (" ovlEP" if l['overlap_ep'] else "")
    return s
for f in sys.argv[1:]:
    d = json.load(open(f)); p = d['plans'][0]; q = p['prediction']
    print(f"{f}: {lay(p['layout'])}  step {q['step_s']:.3f} s  MFU {q['mfu']:.1%}  bd " + ", ".join(f"{k} {v:.3f}" for k, v in q['breakdown_s'].items() if v > 0.001))
    for a in d['alternatives']:
        if a['instead'].startswith('EP') and a['plan'] and int(a['instead'].split()[1]) <= 16:
            aq = a['plan']['prediction']
            print(f"   {a['instead']}: {lay(a['plan']['layout'])} {aq['step_s']:.3f} s ({a['vs_best']:+.1%}): {a['why']}")
