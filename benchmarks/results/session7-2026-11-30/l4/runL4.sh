#!/bin/bash
# session 7, call 4 (2x H200): the host figures re-measured on this machine into call 3's profile (l3 + this host),
# then the 34 predict-vs-measure cases against it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/l4; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runL4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; uptime > $R/uptime.txt
SECONDS=0; timeout 170 python -m runtime.profiler.host --profile gpu/l3-h200-sxm.json --out $R/h200-sxm.json --gpus 2 > $R/host.log 2>&1; echo "host rc=$? ${SECONDS}s"; tail -3 $R/host.log
P=$R/h200-sxm.json; [ -f $P ] || P=gpu/l3-h200-sxm.json
SECONDS=0; OUT=$R/c2 PROFILE=$P timeout 110 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$P timeout 60 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
wc -l $R/*/validation.csv
cd $OUT && tar czf l4.tgz l4 && rm -rf l4
