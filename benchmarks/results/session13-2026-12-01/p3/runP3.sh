#!/bin/bash
# session 13, call p3 (one GPU): a full kernel profile timed at the power cap (no host stage; --budget 420 so that
# one GPU times the whole grid), composed with the shipped profile's host and collectives; its accuracy (held-out
# GEMMs, FP8, attention, the layer check replayed sustained); the heater's CUDA tests
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP3.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 450 python -m runtime.profiler.cli --out $R/h200-heated.json --budget 420 --no-host --no-progress > $R/profile.log 2>&1; echo "profile rc=$? ${SECONDS}s"; tail -3 $R/profile.log
python benchmarks/compose_profile.py $R/h200-heated.json --host-from profiles/h200-sxm.json --collectives-from profiles/h200-sxm.json --why "session 13 call p3: kernels timed at the power cap on one GPU; host and collectives as shipped (session 7 calls k1, l1)" --out $R/h200-heated-composed.json > $R/compose.log 2>&1; echo "compose rc=$?"
SECONDS=0; timeout 100 python benchmarks/profile_accuracy.py --profile $R/h200-heated-composed.json --out $R/acc --gpus 1 --skip collectives > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; cat $R/acc.log | cut -c1-400
SECONDS=0; timeout 60 python -m pytest -q tests/profiler/test_power_cap.py > $R/test_power_cap.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -2 $R/test_power_cap.log
kill $SMI
cut -d, -f1-6,11-13 $R/acc/layer.csv
python -c "
import json; d=json.load(open('$R/h200-heated.json')); e=d['extras']; print(e['stage_seconds'], e['gemm_grid']['timed'], e['gemm_grid']['shapes']); print(e.get('sustained_gemm'))
print([p for p in d['provenance']['parts'] if p['part']=='kernel_timing'])"
cd $OUT && tar czf p3.tgz p3 && rm -rf p3
