#!/bin/bash
# session 18, call d1 (one GPU): issue 3's layer check (TP1, three sizes, forward + backward) against the shipped
# measured profile (profiles/h200-sxm.json), as session 15's r4 ran it, on this session's machine; clocks every 100 ms
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/d1; mkdir -p $R; date -u > $R/date.txt; cp runD.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 300 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --gpus 1 --skip gemm,fp8,attention,collectives > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; cut -c1-420 $R/acc.log | tail -8
kill $SMI
cd $OUT && tar czf d1.tgz d1 && rm -rf d1
