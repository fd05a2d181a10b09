#!/bin/bash
# session 17, call t2 (one GPU): a fresh held-out GEMM set for issue 3, never measured before: shapes 150-749 of
# profile_accuracy's seeded shuffle (sessions 14-15 timed 0-149), two passes, against the shipped measured
# profile (profiles/h200-sxm.json, session 14's q3). Kept aside to report any change to the GEMM lookup on.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/t2; mkdir -p $R; date -u > $R/date.txt; cp runT2.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 200 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 420 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --gpus 1 --skip fp8,attention,collectives,layer --gemm-first 150 --gemm-shapes 600 --passes 2 > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; cut -c1-420 $R/acc.log | tail -4
kill $SMI
cd $OUT && tar czf t2.tgz t2 && rm -rf t2
