#!/bin/bash
# session 9, call 6 (2x H200): the host-paced plans (FSDP 'full' sharding, EP2 MoE: eager steps) validated on
# the same machine whose host the profiler measures in this call (runtime.profiler.host), so that their
# prediction can be made with this machine's host figures
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/n6; mkdir -p $R/v; date -u > $R/date.txt; cp gpu/runN6.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
Q=benchmarks/validation/quality/plans; C=benchmarks/validation/2gpu/plans
SECONDS=0; timeout 150 python -m runtime.validate $Q/q-*-full.json $C/16-*.json $C/17-*.json --steps 6 --warmup 3 --timeout 40 --append $R/v/validation.csv > $R/v/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"; wc -l < $R/v/validation.csv
SECONDS=0; timeout 230 python -m runtime.profiler.host --profile profiles/h200-sxm.json --out $R/h200-sxm-host-n6.json > $R/host.log 2>&1; echo "host rc=$? ${SECONDS}s"; tail -1 $R/host.log
cd $OUT && tar czf n6.tgz n6 && rm -rf n6
