"""Session 8: graph / eager variants of the bar plans (stale predictions; plan validate re-predicts)."""
import sys
from dataclasses import replace
from pathlib import Path
from planner.plan import Plan

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
base = {"gpt13-tp1": "gpu/gpt13-tp1.json", "gpt13-dp2": "gpu/gpt13-dp2.json", "gpt67-tp2": "gpu/gpt67-tp2.json",
        "gpt67-tp1": "gpu/gpt67-tp1.json", "gpt13-tp2mb1": "gpu/tp2-mb1.json"}
for name, path in base.items():
    p = Plan.load(Path(path))
    for g in (False, True):
        replace(p, layout=replace(p.layout, cuda_graph=g)).save(out / f"{name}-{'graph' if g else 'eager'}.json", overwrite=True)
p = Plan.load(Path("gpu/tp2-mb1.json"))
for g in (False, True):
    replace(p, layout=replace(p.layout, micro_batch=4, cuda_graph=g)).save(out / f"gpt13-tp2mb4-{'graph' if g else 'eager'}.json", overwrite=True)
p = Plan.load(Path("gpu/mem-cp2.json"))
replace(p, layout=replace(p.layout, sharding="optimizer", cuda_graph=True)).save(out / "gpt13-cp2-graph.json", overwrite=True)
replace(p, layout=replace(p.layout, sharding="optimizer", cuda_graph=False)).save(out / "gpt13-cp2-eager.json", overwrite=True)
