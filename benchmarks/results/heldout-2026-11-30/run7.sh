#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
V() { timeout 60 python -m runtime.validate gpu/$1.json --steps 5 --warmup 2 --device cuda --append $OUT/heldout.csv >> $OUT/heldout.log 2>&1; echo "$1 rc=$?"; }
V h1; V h2; CUDA_VISIBLE_DEVICES=0 V h3; V h4
cat $OUT/heldout.csv
