#!/bin/bash
# Session 13: which profile predicts whole one-GPU steps best. Run from the repository root; writes comparison.txt.
# in.json: the kernel tables timed at the power cap (call p3) with session 9's fitted factors carried over.
set -e
R=benchmarks/results/session13-2026-12-01/calibration
T=$(mktemp -d)
python benchmarks/compose_profile.py benchmarks/results/session13-2026-12-01/p3/h200-heated-composed.json \
  --calibration-from "${OLD_CALIBRATED:-profiles/h200-sxm-calibrated.json}" \
  --why "session 13: session 9's fitted factors carried onto the kernel tables timed at the power cap (call p3)" --out $T/in.json
# a) compute and expert fitted on session 12's s7 runs (llama-1b-gqa held out)
plan calibrate benchmarks/results/session12-2026-12-01/s7/v1/validation.csv --profile $T/in.json -o $T/a.json \
  --holdout-models llama-1b-gqa --terms compute,expert
# b) compute and expert fitted on s7 and p4's short runs (30, a random 30% held out)
plan calibrate $R/runs-s7-p4/all.csv --profile $T/in.json -o $T/b.json --terms compute,expert
# c) compute left at 1 (the tables are at the power cap), expert fitted on the MoE runs of s7 and p4
python - $T <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + "/in.json")); d["efficiency"]["compute"] = 1.0
json.dump(d, open(sys.argv[1] + "/in1.json", "w"))
PY
plan calibrate $R/runs-s7-p4/all.csv --profile $T/in1.json -o $T/c.json --terms expert \
  --holdout-models gpt-1.3b,llama-1b-gqa,bert-large,gpt-13b-6l,llama3-8b-8l
echo "== p4's sustained runs (14 steps, 8 warm-up), which none of the fits saw:"
python $R/repredict.py benchmarks/results/session13-2026-12-01/p4/long/validation.csv \
  "${OLD_CALIBRATED:-profiles/h200-sxm-calibrated.json}" profiles/h200-sxm.json $T/a.json $T/b.json $T/c.json
rm -rf $T
