#!/bin/bash
# session 11, call r9 (one GPU): the 12 one-GPU validation plans at the current runtime and shipped (composed) profiles
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/r9; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR9.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 STEPS=6 WARMUP=3 OUT=$R/v1 bash benchmarks/validation/1gpu/run.sh > $R/v1.out 2>&1; echo "1gpu set rc=$? ${SECONDS}s"; cut -d, -f1,9,11-16 $R/v1/validation.csv
cd $OUT && tar czf r9.tgz r9 && rm -rf r9
