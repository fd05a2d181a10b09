#!/bin/bash
# session 5, call 1 (2x H200): ring-attention block kernels (cuDNN vs flash), CP/EP bars, full profile
# with the round-based host probe and collective warm-up, its accuracy
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/j1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runJ1.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
echo "== ring kernels"; timeout 60 python benchmarks/ring_attention_kernels.py --out $R/ring_kernels.json > $R/ring_kernels.log 2>&1; echo rc=$?; grep -E '"(backend|rel_out|rel_dq|error|tflops|cp2_rank|fwd_bwd)' $R/ring_kernels.json | tr -d '\n' | cut -c1-1500; echo
echo "== bars"; timeout 200 python benchmarks/parallel_bars.py --out $R/bars --only cp,ep --budget-s 170 > $R/bars.out 2>&1; echo rc=$?; tail -12 $R/bars/parallel_bars.log
echo "== profile"; timeout 290 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --force --no-progress > $R/profile.log 2>&1; echo rc=$?; tail -14 $R/profile.log
echo "== accuracy"; timeout 100 python benchmarks/profile_accuracy.py --profile $R/h200-sxm.json --out $R/acc --gemm-shapes 200 > $R/acc.log 2>&1; echo rc=$?; grep -E "^(gemm|attention|collectives|layer):" $R/acc.log | cut -c1-250
cd $OUT && tar czf j1.tgz j1 && rm -rf j1
