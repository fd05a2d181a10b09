#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T() { n=$1; shift; p=$1; shift; timeout 90 python -m torch.distributed.run --nproc-per-node=$n --standalone -m runtime.train --plan $p --steps 4 --device cuda --trace-step 3 --trace-out $OUT/trace-$(basename $p .json).txt --results /tmp/$(basename $p).csv > /tmp/log-$(basename $p).txt 2>&1; echo "$p rc=$?"; grep "^step" /tmp/log-$(basename $p).txt | tail -2; }
T 2 benchmarks/validation/2gpu/plans/01-gpt13-tp2-mb1-none.json
CUDA_VISIBLE_DEVICES=0 T 1 benchmarks/validation/1gpu/plans/01-gpt13-mb1-none.json
CUDA_VISIBLE_DEVICES=0 T 1 benchmarks/validation/1gpu/plans/09-moe-mb2-none.json
T 2 benchmarks/validation/2gpu/plans/04-gpt13-pp2-mb1-none.json
