#!/bin/bash
# session 18, call a1 (one GPU), tree at HEAD: the runtime's CUDA tests; benchmarks/tune_qk_norm.py (the q/k-norm
# backward's block / programs-per-SM / warps); GPT-1.3B on one GPU (bf16 main gradients, CUDA graph, 40 steps, twice)
# beside the torch.compile anchor as given and with a next-token loss (benchmarks/anchor_variants.py) and
# Megatron-Core from pip (0.19.2, TP1): issue 4's one-GPU ratios at this tree. Clocks every 100 ms.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/a1; mkdir -p $R; date -u > $R/date.txt; cp runA.sh commit $R/; nvidia-smi -L > $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --target .site whl/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 200 python -m pytest -p no:cacheprovider -rfEs tests/runtime/test_graph.py tests/runtime/test_rotary.py tests/runtime/test_norm.py tests/runtime/test_bias_gelu.py tests/runtime/test_swiglu.py tests/runtime/test_optimizer.py tests/runtime/test_model.py tests/runtime/test_qk_norm.py tests/runtime/test_moe_rows.py tests/runtime/test_grouped_wgrad.py tests/runtime/test_fp8.py > $R/cuda-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; grep -E "passed|failed" $R/cuda-tests.log | tail -2; grep -E "^(FAILED|ERROR)" $R/cuda-tests.log | cut -c1-200 | head
SECONDS=0; timeout 120 python benchmarks/tune_qk_norm.py > $R/tune_qk_norm.csv 2> $R/tune_qk_norm.err; echo "tune rc=$? ${SECONDS}s"; cat $R/tune_qk_norm.csv; tail -3 $R/tune_qk_norm.err
run_ours() { date -u +%T.%N > $R/gpt13-$1_start.txt; SECONDS=0
  timeout 100 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan plans/gpt13-tp1-bf16.json --steps 40 --device cuda --results $R/gpt13-$1.csv > $R/gpt13-$1.log 2>&1; echo "gpt13 $1 rc=$? ${SECONDS}s"; }
run_anchor() { date -u +%T.%N > $R/anchor-$1_start.txt; SECONDS=0
  timeout 120 python anchor_variants.py $1 >> $R/anchor_variants.jsonl 2>> $R/anchors.err; echo "anchor $1 rc=$? ${SECONDS}s"; }
run_ours bf16; run_anchor given; run_anchor next_init; run_ours bf16b
date -u +%T.%N > $R/mcore_start.txt; SECONDS=0
(cd anchors; PYTHONPATH=$PWD/../.site timeout 120 python -m torch.distributed.run --nproc-per-node 1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4) >> $R/mcore.jsonl 2>> $R/mcore.err; echo "mcore rc=$? ${SECONDS}s"
kill $SMI
cut -c1-300 $R/anchor_variants.jsonl $R/mcore.jsonl; tail -3 $R/mcore.err
for g in bf16 bf16b; do python - $R/gpt13-$g.csv $g <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
s16 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) <= 16)
s40 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) >= 16)
print(f"gpt13 {sys.argv[2]}: median of steps 5-16 {s16:.5f} s = {4 * 2048 / s16:.0f} tok/s; steps 16-40 {s40:.5f} s = {4 * 2048 / s40:.0f} tok/s")
PY
done
cd $OUT && tar czf a1.tgz a1 && rm -rf a1
