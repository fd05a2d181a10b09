#!/bin/bash
# session 6, call 1 (2x H200): full profile (group-reusing host probe with single-rank figures, FP8 table,
# 3x2^e GEMM grid), its accuracy, and the 34 predict-vs-measure cases against it, on one machine
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/k1; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runK1.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
(lscpu | grep -E "Model name|^CPU\(s\)|MHz"; nproc) > $R/cpu.txt 2>&1
echo "== profile"; SECONDS=0; timeout 295 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --force --no-progress > $R/profile.log 2>&1; echo "rc=$? ${SECONDS}s"; tail -14 $R/profile.log | grep -v Warning
P=$R/h200-sxm.json; [ -f $P ] || P=profiles/h200-sxm.json
echo "== accuracy"; SECONDS=0; timeout 95 python benchmarks/profile_accuracy.py --profile $P --out $R/acc --gemm-shapes 150 > $R/acc.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "^(gemm|fp8|attention|collectives|layer):" $R/acc.log | cut -c1-250
SECONDS=0; OUT=$R/c2 PROFILE=$P timeout 120 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$P timeout 65 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
wc -l $R/*/validation.csv
cd $OUT && tar czf k1.tgz k1 && rm -rf k1
