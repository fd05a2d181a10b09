#!/bin/bash
# session 15, call r4 (one GPU): issue 3's checks against the shipped measured profile (profiles/h200-sxm.json,
# session 14's q3) on this session's machine, as q4 ran them: 150 held-out GEMMs and 48 attention cases in three
# passes, and the layer check (TP1, three sizes); clocks every 100 ms
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r4; mkdir -p $R; date -u > $R/date.txt; cp runR4.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 200 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 330 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --gpus 1 --skip fp8,collectives --passes 3 > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; cut -c1-420 $R/acc.log | tail -6
kill $SMI
cd $OUT && tar czf r4.tgz r4 && rm -rf r4
