#!/bin/bash
# session 5, call 3 (2x H200): host probe with the single-rank figures merged into call 2's profile, then the
# 34 predict-vs-measure cases and the 100-plan quality sweep against it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/j3; mkdir -p $R/c2 $R/c1 $R/q; date -u > $R/date.txt; cp gpu/runJ3.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
P=$R/h200-sxm.json
echo "== host"; SECONDS=0; timeout 150 python -m runtime.profiler.host --profile gpu/j2-h200-sxm.json --out $P --gpus 2 > $R/host.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -v Warning $R/host.log | tr -d '\n ' | cut -c1-900; echo
[ -f $P ] || P=gpu/j2-h200-sxm.json
OUT=$R/c2 PROFILE=$P timeout 125 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$?"
CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$P timeout 70 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$?"
OUT=$R/q PROFILE=$P timeout 300 bash benchmarks/validation/quality/run.sh > $R/q.out 2>&1; echo "quality rc=$?"
wc -l $R/*/validation.csv
cd $OUT && tar czf j3.tgz j3 && rm -rf j3
