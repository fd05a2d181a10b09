#!/bin/bash
# session 15, call r1 (one GPU): plan validate with the traced step's components, on the 18 one-GPU plans of
# sessions 12-13 (CUDA graphs) and eager copies of four of them (benchmarks/validation/1gpu-s15), sustained as in
# session 13's p4 (14 steps, 8 warm-up); clocks every 100 ms
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/r1; mkdir -p $R/smoke $R/long; date -u > $R/date.txt; cp runR1.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 90 python -m runtime.validate benchmarks/validation/1gpu/plans/02-gpt13-mb2-sel.json benchmarks/validation/1gpu-s15/plans/05-llama1b-mb1-none-eager.json --steps 4 --warmup 2 --device cuda --timeout 40 --append $R/smoke/validation.csv > $R/smoke/validation.log 2>&1; echo "smoke rc=$? ${SECONDS}s"
tail -40 $R/smoke/validation.log
PLANS="$(ls benchmarks/validation/1gpu/plans/*.json) $(ls benchmarks/validation/1gpu-s13/plans/*.json) $(ls benchmarks/validation/1gpu-s15/plans/*.json)"
SECONDS=0; timeout 420 python -m runtime.validate $PLANS --steps 14 --warmup 8 --device cuda --timeout 100 --append $R/long/validation.csv > $R/long/validation.log 2>&1; echo "long rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/long/validation.csv
cd $OUT && tar czf r1.tgz r1 && rm -rf r1
