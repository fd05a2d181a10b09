#!/bin/bash
# session 18, call b1 (one GPU): the q/k-norm backward at 64 rows / 8 programs per SM: its CUDA tests; the tuning
# sweep again, two passes, with 128 rows; then plan validate (12 steps, 6 warm-up) on t3/t5's six fidelity plans
# (qwen3 x3 with the fused q/k norms, qwen2 x2, llama3) and the 18 graphed one-GPU plans of sessions 12-13, at this tree.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/b1; mkdir -p $R/val; date -u > $R/date.txt; cp runB.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 60 python -m pytest -p no:cacheprovider -o addopts= -q -rfE tests/runtime/test_qk_norm.py -k cuda > $R/cuda-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $R/cuda-tests.log
SECONDS=0; timeout 100 python benchmarks/tune_qk_norm.py > $R/tune_qk_norm.csv 2> $R/tune_qk_norm.err; echo "tune rc=$? ${SECONDS}s"; sort -t, -k5 -n $R/tune_qk_norm.csv | head -8; tail -2 $R/tune_qk_norm.err
F=benchmarks/validation/fidelity-s17
PLANS="$F/plans-qk-fused/01-qwen3-8l-mb1-none.json $F/plans-qk-fused/02-qwen3-8l-mb2-sel.json $F/plans-qk-fused/03-qwen3-8l-mb4-full.json $F/plans/04-qwen2-8l-mb1-none.json $F/plans/05-qwen2-8l-mb2-sel.json $F/plans/06-llama3-8l-mb2-none.json $(ls benchmarks/validation/1gpu/plans/*.json) $(ls benchmarks/validation/1gpu-s13/plans/*.json)"
SECONDS=0; timeout 400 python -m runtime.validate $PLANS --steps 12 --warmup 6 --device cuda --timeout 100 --append $R/val/validation.csv > $R/val/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/val/validation.csv
cd $OUT && tar czf b1.tgz b1 && rm -rf b1
