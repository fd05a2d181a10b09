#!/bin/bash
# session 14, call q4 (one GPU), tree gpu/new: profile_accuracy of call q3's profile (gpu/q3-composed.json) with the
# held-out GEMMs and attention cases timed in three passes, the attention cases now with the full reheat before each
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/q4; mkdir -p $R; date -u > $R/date.txt; cp gpu/runQ4.sh $R/; cp gpu/new/commit $R/commit; nvidia-smi -L > $R/gpu.txt
P=$PWD/gpu/q3-composed.json
cd gpu/new; export PYTHONPATH=$PWD
SECONDS=0; timeout 200 python benchmarks/profile_accuracy.py --profile $P --out $R/acc --gpus 1 --skip fp8,collectives --passes 3 > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; cut -c1-420 $R/acc.log
cd $OUT && tar czf q4.tgz q4 && rm -rf q4
