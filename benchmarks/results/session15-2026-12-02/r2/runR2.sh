#!/bin/bash
# session 15, call r2 (one GPU): is the eager (host-paced) miss of r1 this machine's host? The single-rank host
# figures measured twice on this machine (runtime.profiler.host --single-rank-only, onto the default profile),
# the four eager plans validated again (14 steps, 8 warm-up), and the CPU described
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/r2; mkdir -p $R/eager; date -u > $R/date.txt; cp runR2.sh commit $R/; nvidia-smi -L > $R/gpu.txt
(lscpu; nproc; uptime) > $R/cpu.txt 2>&1
for k in a b; do SECONDS=0; timeout 150 python -m runtime.profiler.host --profile profiles/h200-sxm-calibrated.json --out $R/host-single-$k.json --single-rank-only --gpus 1 > $R/host-single-$k.log 2>&1; echo "host $k rc=$? ${SECONDS}s"; tail -3 $R/host-single-$k.log; done
SECONDS=0; timeout 200 python -m runtime.validate $(ls benchmarks/validation/1gpu-s15/plans/*.json) --steps 14 --warmup 8 --device cuda --timeout 60 --append $R/eager/validation.csv > $R/eager/validation.log 2>&1; echo "eager rc=$? ${SECONDS}s"
cut -d, -f1,9,11-16 $R/eager/validation.csv
grep -A12 "family_single" $R/host-single-a.log | head -30
cd $OUT && tar czf r2.tgz r2 && rm -rf r2
