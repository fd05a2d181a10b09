#!/bin/bash
# session 9, call 4 (2x H200): the three validation sets regenerated at this tree (the planner plays the pipeline
# schedule; leak between plans fixed): quality (100 plans), 2-GPU cases (22), 1-GPU cases (12)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/n4; mkdir -p $R/q $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runN4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
V=benchmarks/validation
SECONDS=0; STEPS=6 WARMUP=3 OUT=$R/q PLAN_TIMEOUT=40 timeout 330 bash $V/quality/run.sh > $R/q/run.out 2>&1; echo "quality rc=$? ${SECONDS}s"; tail -1 $R/q/validation.log; wc -l < $R/q/validation.csv
SECONDS=0; STEPS=8 WARMUP=3 OUT=$R/c2 timeout 130 bash $V/2gpu/run.sh > $R/c2/run.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"; wc -l < $R/c2/validation.csv
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 STEPS=8 WARMUP=3 OUT=$R/c1 timeout 90 bash $V/1gpu/run.sh > $R/c1/run.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"; wc -l < $R/c1/validation.csv
cd $OUT && tar czf n4.tgz n4 && rm -rf n4
