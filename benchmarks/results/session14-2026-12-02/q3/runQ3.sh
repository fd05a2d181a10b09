#!/bin/bash
# session 14, call q3 (one GPU), tree gpu/new (commit in gpu/new/commit): a full kernel profile timed at the power
# cap heated after each kernel's warm-up, the warm-up not counted as idle (no host stage; --budget 420 so that one GPU times the whole
# grid), composed with the shipped profile's host and collectives; its accuracy with the held-out GEMMs and
# attention cases timed in three passes, and the layer check replayed back to back
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/q3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runQ3.sh $R/; cp gpu/new/commit $R/commit; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
cd gpu/new; export PYTHONPATH=$PWD PLAN_COMMIT=$(cat commit)
SECONDS=0; timeout 450 python -m runtime.profiler.cli --out $R/h200-heated.json --budget 420 --no-host --no-progress > $R/profile.log 2>&1; echo "profile rc=$? ${SECONDS}s"; tail -3 $R/profile.log
python benchmarks/compose_profile.py $R/h200-heated.json --host-from profiles/h200-sxm.json --collectives-from profiles/h200-sxm.json --why "session 14 call q3: kernels timed at the power cap on one GPU, heated after each kernel's warm-up; host and collectives as shipped (session 7 calls k1, l1)" --out $R/h200-heated-composed.json > $R/compose.log 2>&1; echo "compose rc=$?"
SECONDS=0; timeout 110 python benchmarks/profile_accuracy.py --profile $R/h200-heated-composed.json --out $R/acc --gpus 1 --skip fp8,collectives --passes 3 > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; cut -c1-420 $R/acc.log
kill $SMI
python -c "
import json; d=json.load(open('$R/h200-heated.json')); e=d['extras']; print(e['stage_seconds'], e['gemm_grid']['timed'], e['gemm_grid']['shapes'])
print([p for p in d['provenance']['parts'] if p['part']=='kernel_timing'])"
cd $OUT && tar czf q3.tgz q3 && rm -rf q3
