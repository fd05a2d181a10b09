#!/bin/bash
# session 11, call r2 (one GPU): the torch.compile anchor as given and with a non-degenerate objective
# (gpu/anchor_variants.py), each timed over 40 steps, beside GPT-1.3B on our runtime (fp32 and bf16 main
# gradients, 40 replayed steps), clocks and power logged
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/r2; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR2.sh gpu/mkbf16.py gpu/anchor_variants.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
python gpu/mkbf16.py $R/plans > /dev/null
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > $R/clocks.csv 2>&1 & SMI=$!
run_ours() { date -u +%T.%N > $R/gpt13-$1_start.txt; SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 100 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-${1%b}.json --steps 40 --device cuda --results $R/gpt13-$1.csv > $R/gpt13-$1.log 2>&1; echo "gpt13 $1 rc=$? ${SECONDS}s"; }
run_anchor() { date -u +%T.%N > $R/anchor-$1_start.txt; SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 120 python gpu/anchor_variants.py $1 >> $R/anchor_variants.jsonl 2>> $R/anchors.err; echo "anchor $1 rc=$? ${SECONDS}s"; }
run_anchor given; run_ours bf16; run_anchor next_init; run_ours fp32; run_anchor next; run_ours bf16b
kill $SMI
cut -c1-420 $R/anchor_variants.jsonl; tail -3 $R/anchors.err
for g in bf16 fp32 bf16b; do python - $R/gpt13-$g.csv $g <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
s16 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) <= 16)
s40 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) >= 16)
print(f"gpt13 {sys.argv[2]}: median of steps 5-16 {s16:.5f} s = {4 * 2048 / s16:.0f} tok/s; steps 16-40 {s40:.5f} s = {4 * 2048 / s40:.0f} tok/s; loss {rows[-1]['loss']}")
PY
done
cd $OUT && tar czf r2.tgz r2 && rm -rf r2
