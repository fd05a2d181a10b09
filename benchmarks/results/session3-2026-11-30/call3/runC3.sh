#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/c3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runC3.sh gpu/commit $R/
echo "== kernel check"; PYTHONPATH=. timeout 90 python gpu/kernel_check.py 2>&1 | tail -12 | tee $R/kernel_check.txt
echo "== profile"; timeout 290 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --force > $R/profile.log 2>&1; echo rc=$?; tail -12 $R/profile.log
echo "== bars"; timeout 200 python benchmarks/parallel_bars.py --out $R/bars --only ep,cp --budget-s 170 > $R/bars.out 2>&1; echo rc=$?; tail -15 $R/bars/parallel_bars.log
echo "== layer"; timeout 80 python benchmarks/profile_accuracy.py --profile $R/h200-sxm.json --out $R/layer --skip gemm,attention,collectives > $R/layer.log 2>&1; echo rc=$?; tail -12 $R/layer.log
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
