#!/bin/bash
# session 4, call 5 (2x H200): plan-quality sweep (every legal 2-GPU plan of gpt-1.3b and llama-1b-gqa) with the new profile
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/h5; mkdir -p $R/q; date -u > $R/date.txt; cp gpu/runH5.sh gpu/commit $R/
OUT=$R/q timeout 320 bash benchmarks/validation/quality/run.sh > $R/q.out 2>&1; echo "quality rc=$?"
wc -l $R/q/validation.csv; grep -c "=== plan" $R/q/validation.log
cd $OUT && tar czf h5.tgz h5 && rm -rf h5
