"""Re-predict a plan validate CSV (with its .plans.jsonl sidecar) with each profile given; prints median and worst
|error| and the signed error per run. Session 13, the calibration comparison (compare.sh)."""
import sys
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
from validation_report import load
from planner.cluster import ClusterSpec
from planner.cost import evaluate
from planner.profile import load_profile
csvp = Path(sys.argv[1])
df, plans = load(csvp)
for pp in sys.argv[2:]:
    prof = load_profile(pp, "h200-sxm")
    errs = []
    for (i, row), plan in zip(df.iterrows(), plans):
        pred = evaluate(plan, ClusterSpec.from_dict(plan.cluster), prof)
        errs.append((row["model"], row["micro_batch"], row["recompute"], pred.step_s / row["measured_step_s"] - 1))
    a = sorted(abs(e[3]) for e in errs)
    n = len(a)
    med = a[n//2] if n % 2 else 0.5*(a[n//2-1]+a[n//2])
    print(Path(pp).name, "median %.1f%% worst %.1f%%" % (100*med, 100*a[-1]))
    print("   ", " ".join("%s/%s/%s %+.1f" % (m[:8], mb, str(r)[:5], 100*e) for m, mb, r, e in errs))
