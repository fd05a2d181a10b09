#!/bin/bash
# session 7, call 3 (2x H200): CUDA tests of the Triton SwiGLU and the MoE layer; EP2 bar with the fused SwiGLU
# experts and the atomic-free dispatch gather / combine; a full profile of this runtime (Triton SwiGLU) and its accuracy
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/l3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runL3.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 90 python -m pytest -q -x tests/runtime/test_swiglu.py tests/parallel/test_expert.py -p no:cacheprovider > $R/cuda_test.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -2 $R/cuda_test.log
echo "== ep bar"; SECONDS=0; timeout 110 python benchmarks/parallel_bars.py --out $R/bars --only ep --budget-s 100 > $R/bars.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -3 $R/bars/parallel_bars.log | head -1
echo "== profile"; SECONDS=0; timeout 285 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --budget 260 --force --no-progress > $R/profile.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -vi warn $R/profile.log | tail -11
P=$R/h200-sxm.json; [ -f $P ] || P=profiles/h200-sxm.json
echo "== accuracy"; SECONDS=0; timeout 70 python benchmarks/profile_accuracy.py --profile $P --out $R/acc --gemm-shapes 150 > $R/acc.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "^(gemm|fp8|attention|collectives|layer):" $R/acc.log | cut -c1-200
cd $OUT && tar czf l3.tgz l3 && rm -rf l3
