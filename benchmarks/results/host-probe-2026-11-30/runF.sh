#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
mkdir -p $OUT/f; date -u > $OUT/f/date.txt; cp gpu/runF.sh $OUT/f/
echo "== host"; timeout 400 python -m runtime.profiler.host --profile profiles/h200-sxm.json --out $OUT/f/h200-sxm-host.json --gpus 2 > $OUT/f/host.log 2>&1; echo rc=$?; grep -v Warning $OUT/f/host.log | tail -45
cd $OUT && tar czf f.tgz f && rm -rf f
