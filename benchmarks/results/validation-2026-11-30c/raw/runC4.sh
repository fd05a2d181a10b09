#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/c4; mkdir -p $R/q $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runC4.sh gpu/commit $R/
OUT=$R/q timeout 290 bash benchmarks/validation/quality/run.sh > $R/q.out 2>&1; echo "quality rc=$?"; ls $R/q
OUT=$R/c2 timeout 125 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$?"
CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 timeout 70 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$?"
wc -l $R/*/validation.csv
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
