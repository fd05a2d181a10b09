"""The eager rows of r1 and r2 re-predicted with the default profile and with the default profile carrying r2's
single-rank host figures (host-single-a/-b.json). Run from the repository root:

    python benchmarks/results/session15-2026-12-02/r2/repredict.py > benchmarks/results/session15-2026-12-02/r2/repredicted.txt
"""
import csv
import json
import warnings
from pathlib import Path

from planner.cluster import ClusterSpec
from planner.cost import evaluate
from planner.plan import Plan
from planner.profile import Profile, load_profile

warnings.simplefilter("ignore")
R = Path("benchmarks/results/session15-2026-12-02")
profs = {"default": load_profile(None, "h200-sxm"), "r2 host a": Profile.load(R / "r2/host-single-a.json"),
         "r2 host b": Profile.load(R / "r2/host-single-b.json")}
print("run model measured_s | profile: predicted_s (error)")
for run, base in (("r1", R / "r1/long/validation"), ("r2", R / "r2/eager/validation")):
    rows = list(csv.DictReader(open(f"{base}.csv")))
    plans = [json.loads(line) for line in open(f"{base}.plans.jsonl")]
    for row, pl in zip(rows, plans):
        plan = Plan.from_dict(pl["plan"])
        if plan.layout.cuda_graph:
            continue
        meas = float(row["measured_step_s"])
        out = []
        for k, p in profs.items():
            pred = evaluate(plan, ClusterSpec.from_dict(plan.cluster), p).step_s
            out.append(f"{k}: {pred:.3f} ({(pred - meas) / meas:+.1%})")
        print(run, row["model"], f"{meas:.3f}", "|", " | ".join(out))
