#!/bin/bash
# session 16, call s3 (one GPU): attention across head dimensions 64-256 at 1k/4k/16k, in bursts (as the default
# profile) and at the power cap; then s2's extended profile extended again with phi3-mini (only its attention at
# head dimension 96 is missing), for offline re-prediction of s2's phi3-mini runs. Clocks every 100 ms.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/s3; mkdir -p $R; date -u > $R/date.txt; cp runS3.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 150 python benchmarks/attention_head_dims.py --out $R/burst > $R/burst.log 2>&1; echo "burst rc=$? ${SECONDS}s"; cat $R/burst.log
SECONDS=0; timeout 200 python benchmarks/attention_head_dims.py --out $R/cap --at-power-cap > $R/cap.log 2>&1; echo "cap rc=$? ${SECONDS}s"; cat $R/cap.log
SECONDS=0; timeout 120 python -m runtime.profiler.cli --model benchmarks/models/phi3-mini/config.json --base s2/h200-sxm-calibrated-hf3.json --out $R/h200-sxm-calibrated-hf3-att.json --no-progress --budget 100 > $R/extend.log 2>&1; echo "extend rc=$? ${SECONDS}s"; tail -3 $R/extend.log
kill $SMI
cd $OUT && tar czf s3.tgz s3 && rm -rf s3
