#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
mkdir -p $OUT/e; date -u > $OUT/e/date.txt; cp gpu/runE.sh $OUT/e/
echo "== optimizer"; python -c "
import json, torch
from runtime.profiler.kernels import optimizer_step_s_per_param
s, impl = optimizer_step_s_per_param('cuda', 64 << 20)
print(json.dumps({'optimizer_s_per_param': s, 'impl': impl, 'numel': 64 << 20, 'segments': 4}))" | tee $OUT/e/opt.json
echo "== host"; timeout 300 python -m runtime.profiler.host --profile profiles/h200-sxm.json --out $OUT/e/h200-sxm-host.json --gpus 2 > $OUT/e/host.log 2>&1; echo rc=$?; grep -v Warning $OUT/e/host.log | tail -40
cd $OUT && tar czf e.tgz e && rm -rf e
