#!/bin/bash
# session 4, call 4 (2x H200): predict-vs-measure sweep (quality set + 2-GPU and 1-GPU cases) with the new profile
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/h4; mkdir -p $R/q $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runH4.sh gpu/commit $R/
OUT=$R/q timeout 300 bash benchmarks/validation/quality/run.sh > $R/q.out 2>&1; echo "quality rc=$?"
OUT=$R/c2 timeout 130 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$?"
CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 timeout 75 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$?"
wc -l $R/*/validation.csv
cd $OUT && tar czf h4.tgz h4 && rm -rf h4
