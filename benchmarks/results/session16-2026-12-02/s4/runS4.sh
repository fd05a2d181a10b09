#!/bin/bash
# session 16, call s4 (one GPU): kernel tables of one traced step of phi3-mini mb1 (under-predicted ~11%) and
# qwen2-7b-8l mb1 (within 2%), replayed as CUDA graphs, as in the plans of s2.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/s4; mkdir -p $R; date -u > $R/date.txt; cp runS4.sh commit $R/; nvidia-smi -L > $R/gpu.txt
P=benchmarks/validation/hf-s16/plans
for n in 01-phi3-mb1-none 04-qwen2-8l-mb1-none; do
SECONDS=0; timeout 120 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/$n.json --steps 8 --device cuda --trace-step 7 --trace-out $R/trace-$n.txt > $R/train-$n.log 2>&1; echo "$n rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-$n.txt; grep "step_s" $R/train-$n.log | tail -2 | cut -c1-120
done
cd $OUT && tar czf s4.tgz s4 && rm -rf s4
