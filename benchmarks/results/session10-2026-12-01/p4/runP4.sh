#!/bin/bash
# session 10, call 4 (one GPU): issue 3's attention and layer checks (TP1; TP2 needs two GPUs) against the
# shipped profile with the fused norms' elementwise part
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p4; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 400 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --device cuda --gpus 1 --skip gemm,fp8,collectives > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; tail -25 $R/acc.log
cd $OUT && tar czf p4.tgz p4 && rm -rf p4
