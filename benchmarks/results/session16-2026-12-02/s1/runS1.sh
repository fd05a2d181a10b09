#!/bin/bash
# session 16, call s1 (one GPU): `plan profile --model gpt-2.7b,gpt-1.3b --base h200-sxm-calibrated` (the GEMMs
# the default profile lacks, timed as it was: bursts), then the seven off-grid plans (benchmarks/validation/
# offgrid-s16) validated; both profiles re-predict them offline. Clocks every 100 ms.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/s1; mkdir -p $R/val; date -u > $R/date.txt; cp runS1.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 280 python -m runtime.profiler.cli --model benchmarks/models/gpt-2.7b/config.json,gpt-1.3b --base h200-sxm-calibrated --out $R/h200-sxm-calibrated-gpt27-gpt13.json --no-progress --budget 240 > $R/extend.log 2>&1; echo "extend rc=$? ${SECONDS}s"
tail -5 $R/extend.log
SECONDS=0; timeout 300 python -m runtime.validate benchmarks/validation/offgrid-s16/plans/*.json --steps 14 --warmup 8 --device cuda --timeout 280 --append $R/val/validation.csv > $R/val/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/val/validation.csv
cd $OUT && tar czf s1.tgz s1 && rm -rf s1
