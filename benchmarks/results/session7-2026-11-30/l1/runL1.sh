#!/bin/bash
# session 7, call 1 (2x H200): memory re-check of the FSDP per-micro-batch reduce-scatter (gpt-1.3b CP2 FSDP) and
# llama-1b PP2 with the fixed allocator-trace replay; GPT 6.7B TP2 bf16 vs FP8 (fused quantisation); full profile
# with the collectives held behind a spin and the kernel spin from the host's enqueue time, and its accuracy
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/l1; mkdir -p $R/mem; date -u > $R/date.txt; cp gpu/runL1.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 100 python -m runtime.validate gpu/mem-cp2.json gpu/mem-pp2.json gpu/gpt67-tp2.json gpu/gpt67-tp2-fp8.json --steps 8 --warmup 3 --append $R/val.csv > $R/val.log 2>&1; echo "validate rc=$? ${SECONDS}s"; grep -E "step time|peak memory|rror" $R/val.log | head -12
SECONDS=0; timeout 60 python -m planner.cli launch gpu/mem-cp2.json --steps 4 --device cuda --memory-step 3 --memory-out $R/mem/cp2 > $R/mem/cp2.log 2>&1; echo "trace rc=$? ${SECONDS}s"
echo "== profile"; SECONDS=0; timeout 285 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --budget 260 --force --no-progress > $R/profile.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -vi warn $R/profile.log | tail -11
P=$R/h200-sxm.json; [ -f $P ] || P=profiles/h200-sxm.json
echo "== accuracy"; SECONDS=0; timeout 70 python benchmarks/profile_accuracy.py --profile $P --out $R/acc --gemm-shapes 150 > $R/acc.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "^(gemm|fp8|attention|collectives|layer):" $R/acc.log | cut -c1-200
cd $OUT && tar czf l1.tgz l1 && rm -rf l1
