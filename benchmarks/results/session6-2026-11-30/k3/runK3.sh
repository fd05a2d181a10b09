#!/bin/bash
# session 6, call 3 (2x H200): EP2 bar with the token-level padded dispatch; allocator state at the memory peak
# of two plans that session 5 measured above their prediction (gpt-1.3b CP2 + FSDP, llama-1b-gqa PP2 mb4)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/k3; mkdir -p $R/mem; date -u > $R/date.txt; cp gpu/runK3.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
echo "== ep bar"; SECONDS=0; timeout 150 python benchmarks/parallel_bars.py --out $R/bars --only ep --budget-s 130 > $R/bars.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -4 $R/bars/parallel_bars.log
for n in cp2 pp2; do SECONDS=0; timeout 100 plan launch gpu/mem-$n.json --steps 4 --device cuda --memory-step 3 --memory-out $R/mem/$n > $R/mem/$n.log 2>&1; echo "$n rc=$? ${SECONDS}s"; grep -E "^step" $R/mem/$n.log | tail -1 | cut -c1-200; done
ls $R/mem
cd $OUT && tar czf k3.tgz k3 && rm -rf k3
