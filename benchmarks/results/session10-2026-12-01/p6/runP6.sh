#!/bin/bash
# session 10, call 6 (one GPU): FSDP2 with torch's fused AdamW over DTensor shards on CUDA, against the unsharded optimizer
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p6; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP6.sh gpu/fsdp_one_gpu.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
timeout 120 python gpu/fsdp_one_gpu.py > $R/fsdp.json 2> $R/fsdp.err; echo "rc=$?"; cat $R/fsdp.json; tail -5 $R/fsdp.err
cd $OUT && tar czf p6.tgz p6 && rm -rf p6
