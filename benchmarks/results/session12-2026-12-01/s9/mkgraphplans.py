"""Copies of plan files with the whole step as one CUDA graph (layout.cuda_graph = true), checked by Plan.load."""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from planner.plan import Plan
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for name in sys.argv[3:]:
    d = json.loads((src / f"{name}.json").read_text())
    d["layout"]["cuda_graph"] = True
    out = dst / f"{name}-graph.json"
    out.write_text(json.dumps(d, indent=1))
    Plan.load(out)
    print("wrote", out)
