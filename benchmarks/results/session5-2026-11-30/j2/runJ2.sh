#!/bin/bash
# session 5, call 2 (2x H200): full profile (collectives timed after a skew-absorbing call), its accuracy,
# and the 34 predict-vs-measure cases (22 on 2 GPUs, 12 on 1) against it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/j2; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runJ2.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
echo "== profile"; timeout 300 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --force --no-progress > $R/profile.log 2>&1; echo rc=$?; tail -12 $R/profile.log | grep -v Warning
echo "== accuracy"; timeout 90 python benchmarks/profile_accuracy.py --profile $R/h200-sxm.json --out $R/acc --gemm-shapes 150 > $R/acc.log 2>&1; echo rc=$?; grep -E "^(gemm|attention|collectives|layer):" $R/acc.log | cut -c1-250
OUT=$R/c2 PROFILE=$R/h200-sxm.json timeout 120 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$?"
CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$R/h200-sxm.json timeout 70 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$?"
wc -l $R/*/validation.csv
cd $OUT && tar czf j2.tgz j2 && rm -rf j2
