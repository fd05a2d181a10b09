#!/bin/bash
# session 16, call s2 (one GPU): `plan profile --model phi3-mini,qwen2-7b-8l,mistral-nemo-12b-8l --base
# h200-sxm-calibrated` (timed as that profile was: bursts), then eight plans of those three Hugging Face configs
# (benchmarks/validation/hf-s16) validated; both profiles re-predict them offline. Clocks every 100 ms.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/s2; mkdir -p $R/val; date -u > $R/date.txt; cp runS2.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
M=benchmarks/models
SECONDS=0; timeout 200 python -m runtime.profiler.cli --model $M/phi3-mini/config.json,$M/qwen2-7b-8l/config.json,$M/mistral-nemo-12b-8l/config.json --base h200-sxm-calibrated --out $R/h200-sxm-calibrated-hf3.json --no-progress --budget 180 > $R/extend.log 2>&1; echo "extend rc=$? ${SECONDS}s"
tail -3 $R/extend.log
SECONDS=0; timeout 330 python -m runtime.validate benchmarks/validation/hf-s16/plans/*.json --steps 12 --warmup 6 --device cuda --timeout 320 --append $R/val/validation.csv > $R/val/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/val/validation.csv
cd $OUT && tar czf s2.tgz s2 && rm -rf s2
