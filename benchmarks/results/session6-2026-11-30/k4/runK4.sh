#!/bin/bash
# session 6, call 4 (2x H200): EP2 bar A/B on one machine (token-level padded dispatch, then the exact dispatch
# of d4e03ce swapped in); allocator state at the memory
# peak of gpt-1.3b CP2 + FSDP and llama-1b-gqa PP2 mb4 (session 5: measured above their prediction)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/k4; mkdir -p $R/mem; date -u > $R/date.txt; cp gpu/runK4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
for n in cp2 pp2; do SECONDS=0; timeout 80 python -m planner.cli launch gpu/mem-$n.json --steps 4 --device cuda --memory-step 3 --memory-out $R/mem/$n > $R/mem/$n.log 2>&1; echo "$n rc=$? ${SECONDS}s"; grep -E "^step" $R/mem/$n.log | tail -1 | cut -c1-160; done
echo "== ep bar, padded"; SECONDS=0; timeout 110 python benchmarks/parallel_bars.py --out $R/bars-padded --only ep --budget-s 100 > $R/bars-padded.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -3 $R/bars-padded/parallel_bars.log | head -1
cp gpu/expert_exact.py runtime/parallel/expert.py
echo "== ep bar, exact (d4e03ce's expert.py)"; SECONDS=0; timeout 110 python benchmarks/parallel_bars.py --out $R/bars-exact --only ep --budget-s 100 > $R/bars-exact.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -3 $R/bars-exact/parallel_bars.log | head -1
cd $OUT && tar czf k4.tgz k4 && rm -rf k4
