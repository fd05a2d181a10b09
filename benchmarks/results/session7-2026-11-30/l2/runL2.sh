#!/bin/bash
# session 7, call 2 (2x H200): the Triton SwiGLU on CUDA (tests), llama-1b PP2 mb4 memory and step again (session 6:
# +7.6% over the predicted peak from fp32 SwiGLU backward temporaries); EP2 bar with the fused SwiGLU experts;
# the 34 predict-vs-measure cases against call 1's profile (l1, same machine kind)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/l2; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runL2.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
P=gpu/l1-h200-sxm.json
SECONDS=0; timeout 90 python -m pytest -q -x tests/runtime/test_swiglu.py tests/runtime/test_fp8.py -k cuda -p no:cacheprovider > $R/cuda_test.log 2>&1; echo "cuda tests rc=$? ${SECONDS}s"; tail -2 $R/cuda_test.log
SECONDS=0; timeout 60 python -m runtime.validate gpu/mem-pp2.json --profile $P --steps 8 --warmup 3 --append $R/val.csv > $R/val.log 2>&1; echo "pp2 rc=$? ${SECONDS}s"; grep -E "step time|peak memory|rror" $R/val.log | head -4
echo "== ep bar"; SECONDS=0; timeout 110 python benchmarks/parallel_bars.py --out $R/bars --only ep --budget-s 100 > $R/bars.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -3 $R/bars/parallel_bars.log | head -1
SECONDS=0; OUT=$R/c2 PROFILE=$P timeout 100 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$P timeout 60 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
wc -l $R/*/validation.csv
cd $OUT && tar czf l2.tgz l2 && rm -rf l2
