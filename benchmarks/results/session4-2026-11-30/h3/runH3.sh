#!/bin/bash
# session 4, call 3 (2x H200): full profile with the wgrad table, its accuracy, a device-only TP2 trace
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/h3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runH3.sh gpu/commit $R/
echo "== profile"; timeout 300 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --force --no-progress > $R/profile.log 2>&1; echo rc=$?; tail -12 $R/profile.log
echo "== accuracy"; timeout 150 python benchmarks/profile_accuracy.py --profile $R/h200-sxm.json --out $R/acc --gemm-shapes 300 > $R/acc.log 2>&1; echo rc=$?; grep -E "^(gemm|attention|collectives|layer):" $R/acc.log | cut -c1-250
echo "== trace"; timeout 100 torchrun --standalone --nproc-per-node 2 -m runtime.train --plan gpu/gpt67-tp2.json --steps 7 --trace-step 6 --trace-out $R/trace-gpt67-tp2.txt --device cuda > $R/trace.log 2>&1; echo rc=$?; grep -i exposed $R/trace-gpt67-tp2.txt | head -3; grep "^step" $R/trace.log | cut -c1-80
cd $OUT && tar czf h3.tgz h3 && rm -rf h3
