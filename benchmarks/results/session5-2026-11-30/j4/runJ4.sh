#!/bin/bash
# session 5, call 4 (2x H200, last 240 s of budget): the host CPU on record, the single-rank host figures added
# to call 2's profile, and the 12 one-GPU cases against it in the same call
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/j4; mkdir -p $R/c1; date -u > $R/date.txt; cp gpu/runJ4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
(lscpu | grep -E "Model name|^CPU\(s\)|MHz|Thread|Socket"; nproc; uptime) > $R/cpu.txt 2>&1; cat $R/cpu.txt
P=$R/h200-sxm.json
echo "== single-rank host"; SECONDS=0; timeout 60 python -m runtime.profiler.host --profile gpu/j2-h200-sxm.json --out $P --single-rank-only > $R/host.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "probe|single|wrote" $R/host.log | grep -v Warning | tail -8
[ -f $P ] || P=gpu/j2-h200-sxm.json
CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$P timeout 75 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$?"
wc -l $R/c1/validation.csv
cd $OUT && tar czf j4.tgz j4 && rm -rf j4
