#!/bin/bash
# session 12, call s8 (one GPU): issue 3's layer check (TP1, three sizes) at this runtime against the shipped measured
# profile (elementwise part from s6), with clocks; a traced llama-1b-gqa step
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s8; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS8.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 200 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --gpus 1 --skip gemm,fp8,attention,collectives > $R/acc.log 2>&1; echo "layer rc=$? ${SECONDS}s"; cut -d, -f1-6,11-13 $R/acc/layer.csv
kill $SMI
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan benchmarks/validation/1gpu/plans/05-llama1b-mb1-none.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-llama1b.txt > $R/trace.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-llama1b.txt; head -30 $R/trace-llama1b.txt | cut -c1-90,170-215
cd $OUT && tar czf s8.tgz s8 && rm -rf s8
