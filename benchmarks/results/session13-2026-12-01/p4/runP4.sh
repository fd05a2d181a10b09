#!/bin/bash
# session 13, call p4 (one GPU): plan validate of the 12 one-GPU plans and 6 new ones (benchmarks/validation/1gpu-s13:
# truncated gpt-13b and llama3-8b, gpt-1.3b mb3, bert mb8) with the shipped profiles of this tree, as session 12
# measured them (6 steps, 3 warm-up), then all 18 again sustained (14 steps, 8 warm-up); clocks every 100 ms
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p4; mkdir -p $R/short $R/long; date -u > $R/date.txt; cp gpu/runP4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
PLANS="$(ls benchmarks/validation/1gpu/plans/*.json) $(ls benchmarks/validation/1gpu-s13/plans/*.json)"
SECONDS=0; timeout 200 python -m runtime.validate $PLANS --steps 6 --warmup 3 --device cuda --timeout 60 --append $R/short/validation.csv > $R/short/validation.log 2>&1; echo "short rc=$? ${SECONDS}s"
SECONDS=0; timeout 300 python -m runtime.validate $PLANS --steps 14 --warmup 8 --device cuda --timeout 80 --append $R/long/validation.csv > $R/long/validation.log 2>&1; echo "long rc=$? ${SECONDS}s"
kill $SMI
for s in short long; do echo "== $s"; cut -d, -f1,9,11-16 $R/$s/validation.csv; done
cd $OUT && tar czf p4.tgz p4 && rm -rf p4
