#!/bin/bash
# session 10, call 5 (one GPU): is the sustained step power-limited, and does the norm taken beside backward
# (a side stream concurrent with the GEMMs) cost clock? GPT-1.3B replayed for 40 steps with the bucket norms
# beside backward (default) and after it (overlap_dp off), the torch.compile anchor over 40 steps; clocks logged
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p5; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP5.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
python gpu/mkgraph.py $R/plans > /dev/null
python - $R/plans <<'PY'
import sys
from dataclasses import replace
from pathlib import Path
from planner.plan import Plan
d = Path(sys.argv[1]); p = Plan.load(d / "gpt13-tp1-graph.json")
replace(p, layout=replace(p.layout, overlap_dp=False)).save(d / "gpt13-tp1-graph-norm-after.json", overwrite=True)
PY
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > $R/clocks.csv 2>&1 & SMI=$!
for v in gpt13-tp1-graph gpt13-tp1-graph-norm-after gpt13-tp1-graph; do
  date -u +%T.%N >> $R/starts.txt; echo $v >> $R/starts.txt
  CUDA_VISIBLE_DEVICES=0 timeout 120 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/$v.json --steps 40 --device cuda --results $R/$v.$(date +%s).csv > $R/$v.log 2>&1; echo "$v rc=$?"
  sleep 5
done
date -u +%T.%N >> $R/starts.txt; echo anchor >> $R/starts.txt
(CUDA_VISIBLE_DEVICES=0 timeout 120 python gpu/anchor_sustained.py) > $R/anchor_sustained.jsonl 2>$R/anchors.err; echo "sustained anchor rc=$?"
kill $SMI; cut -c1-250 $R/anchor_sustained.jsonl
for f in $R/*.csv; do case $f in *clocks*) continue;; esac; python - $f <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
a = statistics.median(float(r["step_s"]) for r in rows if 5 <= int(r["step"]) <= 16)
b = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) >= 19)
print(f"{sys.argv[1].split('/')[-1]}: median steps 5-16 {a:.5f} s ({8192 / a:.0f} tok/s), steps 19-40 {b:.5f} s ({8192 / b:.0f} tok/s)")
PY
done
cd $OUT && tar czf p5.tgz p5 && rm -rf p5
