#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
mkdir -p $OUT/g; date -u > $OUT/g/date.txt; cp gpu/runG.sh $OUT/g/
timeout 170 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $OUT/g --skip gemm,attention,collectives > $OUT/g/acc.log 2>&1; echo rc=$?; grep -v Warning $OUT/g/acc.log | tail -3; cat $OUT/g/layer.csv
cd $OUT && tar czf g.tgz g && rm -rf g
