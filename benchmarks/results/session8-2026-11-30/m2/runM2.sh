#!/bin/bash
# session 8, call 2 (2x H200): the 34-plan validation sweep regenerated with CUDA-graph plans (24 of 34 replay a
# graph; pipelines and MoE stay eager), predicted with the shipped profile; the layer check eager and replayed
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/m2; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runM2.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; uptime > $R/uptime.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
SECONDS=0; STEPS=8 WARMUP=3 OUT=$R/c2 PROFILE=profiles/h200-sxm.json timeout 200 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; STEPS=8 WARMUP=3 CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=profiles/h200-sxm.json timeout 120 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
SECONDS=0; timeout 90 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --skip gemm,fp8,attention,collectives > $R/acc.log 2>&1; echo "layer rc=$? ${SECONDS}s"; grep -E "^layer:" $R/acc.log | cut -c1-200; cut -d, -f1,2,5,6,9,12,13 $R/acc/layer.csv
wc -l $R/*/validation.csv
cd $OUT && tar czf m2.tgz m2 && rm -rf m2
