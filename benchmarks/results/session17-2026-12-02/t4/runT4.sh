#!/bin/bash
# session 17, call t4 (one GPU): one traced step each of qwen3-8b-8l and qwen2-7b-8l at micro-batch 1 (t3's plans 01 and
# 04): which kernels Qwen3's q/k norms add, and what they cost.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/t4; mkdir -p $R; date -u > $R/date.txt; cp runT4.sh commit $R/; nvidia-smi -L > $R/gpu.txt
P=benchmarks/validation/fidelity-s17/plans
for f in 01-qwen3-8l-mb1-none 04-qwen2-8l-mb1-none; do
SECONDS=0; timeout 120 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/$f.json --steps 8 --device cuda --trace-step 7 --trace-out $R/trace-$f.txt > $R/train-$f.log 2>&1; echo "$f rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-$f.txt
done
cd $OUT && tar czf t4.tgz t4 && rm -rf t4
