#!/bin/bash
# session 7, call 5 (2x H200): held-out check of the shipped profile on a fresh machine (the 34 cases, predicted
# with profiles/h200-sxm.json; the calibrated profile never saw them); collectives measured with the skew fix
# against the shipped profile; the EP2 bar once more
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/l5; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runL5.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; uptime > $R/uptime.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
SECONDS=0; OUT=$R/c2 PROFILE=profiles/h200-sxm.json timeout 105 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=profiles/h200-sxm.json timeout 60 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
SECONDS=0; timeout 30 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --skip gemm,fp8,attention,layer > $R/acc.log 2>&1; echo "coll rc=$? ${SECONDS}s"; grep -E "^collectives:" $R/acc.log | cut -c1-200
echo "== ep bar"; SECONDS=0; timeout 70 python benchmarks/parallel_bars.py --out $R/bars --only ep --budget-s 60 > $R/bars.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -3 $R/bars/parallel_bars.log | head -1
wc -l $R/*/validation.csv
cd $OUT && tar czf l5.tgz l5 && rm -rf l5
