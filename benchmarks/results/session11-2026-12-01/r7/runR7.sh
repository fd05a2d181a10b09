#!/bin/bash
# session 11, call r7 (one GPU): the qkv split with the bias gradient (runtime/qkv_split.py): CUDA tests (with the
# bias-GELU, fused-norm model and one-GPU graph tests), a traced GPT-1.3B step, GPT-1.3B beside the next_init anchor
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/r7; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR7.sh gpu/mkbf16.py gpu/anchor_variants.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python -m pytest -q -x tests/runtime/test_qkv_split.py tests/runtime/test_bias_gelu.py tests/runtime/test_norm.py tests/runtime/test_graph.py -k "cuda or bf16 or beside or 1-1-1-none-False" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -1 $R/pytest.log; grep -E "^E |passed|failed" $R/pytest.log | head -5
python gpu/mkbf16.py $R/plans > /dev/null
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 60 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-fp32.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-gpt13-tp1-graph.txt > $R/trace.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-gpt13-tp1-graph.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > $R/clocks.csv 2>&1 & SMI=$!
run_ours() { date -u +%T.%N > $R/gpt13-$1_start.txt; SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 100 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-${1%b}.json --steps 40 --device cuda --results $R/gpt13-$1.csv > $R/gpt13-$1.log 2>&1; echo "gpt13 $1 rc=$? ${SECONDS}s"; }
run_anchor() { date -u +%T.%N > $R/anchor-$1_start.txt; SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 120 python gpu/anchor_variants.py $1 >> $R/anchor_variants.jsonl 2>> $R/anchors.err; echo "anchor $1 rc=$? ${SECONDS}s"; }
run_ours bf16; run_anchor next_init; run_ours fp32
kill $SMI
cut -c1-300 $R/anchor_variants.jsonl
for g in bf16 fp32; do python - $R/gpt13-$g.csv $g <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
s16 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) <= 16)
s40 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) >= 16)
print(f"gpt13 {sys.argv[2]}: median of steps 5-16 {s16:.5f} s = {4 * 2048 / s16:.0f} tok/s; steps 16-40 {s40:.5f} s = {4 * 2048 / s40:.0f} tok/s")
PY
done
head -24 $R/trace-gpt13-tp1-graph.txt | cut -c1-100,170-200
cd $OUT && tar czf r7.tgz r7 && rm -rf r7
