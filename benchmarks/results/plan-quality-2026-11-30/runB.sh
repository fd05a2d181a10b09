#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
mkdir -p $OUT/q; date -u > $OUT/q/date.txt
OUT=$OUT/q timeout 545 bash benchmarks/validation/quality/run.sh
cd $OUT && tar czf q.tgz q && rm -rf q
