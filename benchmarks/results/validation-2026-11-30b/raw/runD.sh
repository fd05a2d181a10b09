#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
mkdir -p $OUT/d; date -u > $OUT/d/date.txt; cp gpu/runD.sh $OUT/d/
echo "== host"; timeout 200 python -m runtime.profiler.host --profile profiles/h200-sxm.json --out $OUT/d/h200-sxm-host.json --gpus 2 > $OUT/d/host.log 2>&1; echo rc=$?; tail -22 $OUT/d/host.log
echo "== 2gpu cases"; OUT=$OUT/d/c2 timeout 200 bash benchmarks/validation/2gpu/run.sh | tail -3
echo "== 1gpu cases"; OUT=$OUT/d/c1 timeout 150 bash benchmarks/validation/1gpu/run.sh | tail -3
echo "== 6.7b"; timeout 150 python -m runtime.validate gpu/gpt67-tp1.json gpu/gpt67-tp2.json --steps 10 --warmup 3 --append $OUT/d/bars67.csv > $OUT/d/bars67.log 2>&1; echo rc=$?; grep -E "^---|step time|plan:" $OUT/d/bars67.log; grep "^step 10" $OUT/d/bars67.log | cut -c1-200
cd $OUT && tar czf d.tgz d && rm -rf d
