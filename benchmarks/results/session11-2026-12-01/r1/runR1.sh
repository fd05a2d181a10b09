#!/bin/bash
# session 11, call r1 (one GPU): bf16 main gradients on CUDA (tests), GPT-1.3B with fp32 and bf16 main gradients over
# 40 replayed steps each, clocks logged, with the torch.compile anchor in the same call (its own timing and 40 steps)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/r1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR1.sh gpu/mkbf16.py gpu/anchor_sustained.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 150 python -m pytest -q -x tests/runtime/test_graph.py -k "bf16 or beside or 1-1-1-none-False" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log; grep -E "^E " $R/pytest.log | head -5
python gpu/mkbf16.py $R/plans > /dev/null
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > $R/clocks.csv 2>&1 & SMI=$!
for g in fp32 bf16 fp32b bf16b; do
  P=${g%b}; date -u +%T.%N > $R/gpt13-${g}_start.txt; SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 100 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-$P.json --steps 40 --device cuda --results $R/gpt13-$g.csv > $R/gpt13-$g.log 2>&1; echo "gpt13 $g rc=$? ${SECONDS}s"; tail -1 $R/gpt13-$g.log | cut -c1-200
  [ $g = bf16 ] && { date -u +%T.%N > $R/anchor_compile_start.txt; (cd anchors; CUDA_VISIBLE_DEVICES=0 timeout 100 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile) > $R/anchors.jsonl 2>$R/anchors.err; echo "compile anchor rc=$?"; }
done
date -u +%T.%N > $R/anchor_sustained_start.txt; (CUDA_VISIBLE_DEVICES=0 timeout 120 python gpu/anchor_sustained.py) > $R/anchor_sustained.jsonl 2>>$R/anchors.err; echo "sustained anchor rc=$?"
kill $SMI; cut -c1-200 $R/anchors.jsonl; cut -c1-330 $R/anchor_sustained.jsonl
for g in fp32 bf16 fp32b bf16b; do python - $R/gpt13-$g.csv $g <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
s16 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) <= 16)
s40 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) >= 19)
print(f"gpt13 {sys.argv[2]}: median of steps 5-16 {s16:.5f} s = {4 * 2048 / s16:.0f} tok/s; steps 19-40 {s40:.5f} s = {4 * 2048 / s40:.0f} tok/s; peak {rows[-1].get('peak_mem_gib', '?')}")
PY
done
cd $OUT && tar czf r1.tgz r1 && rm -rf r1
