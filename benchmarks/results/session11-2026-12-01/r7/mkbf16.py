"""Session 11: the bar plans with fp32 and bf16 main gradients (replayed); predictions are redone by validate."""
import sys
from dataclasses import replace
from pathlib import Path
from planner.plan import Plan

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for name, path in {"gpt13-tp1": "gpu/gpt13-tp1.json", "gpt13-dp2": "gpu/gpt13-dp2.json",
                   "gpt67-tp2": "gpu/gpt67-tp2.json", "gpt67-tp1": "gpu/gpt67-tp1.json"}.items():
    p = Plan.load(Path(path))
    for g in ("fp32", "bf16"):
        replace(p, layout=replace(p.layout, cuda_graph=True, grad_dtype=g)).save(out / f"{name}-{g}.json", overwrite=True)
