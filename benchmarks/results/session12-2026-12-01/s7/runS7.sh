#!/bin/bash
# session 12, call s7 (one GPU): the 12 one-GPU validation plans with the fused rotary and the recomposed profiles;
# two llama-1b-gqa plans before (gpu/prev, 1cc54a4) and after the fused rotary, same call
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s7; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS7.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 STEPS=6 WARMUP=3 OUT=$R/v1 bash benchmarks/validation/1gpu/run.sh > $R/v1.out 2>&1; echo "1gpu set rc=$? ${SECONDS}s"; cut -d, -f1,9,11-16 $R/v1/validation.csv
P=benchmarks/validation/1gpu/plans
for t in 05-llama1b-mb1-none 08-llama1b-s8192-mb1-none; do
  SECONDS=0; (cd gpu/prev && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan ../../$P/$t.json --steps 16 --device cuda --results $R/$t-prev.csv > $R/$t-prev.log 2>&1); echo "$t prev rc=$? ${SECONDS}s"
  SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/$t.json --steps 16 --device cuda --results $R/$t.csv > $R/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s"
done
for f in $R/*.csv; do case $f in */v1/*) continue;; esac; python - $f <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
print(sys.argv[1].split("/")[-1], round(statistics.median(float(r["step_s"]) for r in rows), 5), round(statistics.median(float(r["tokens_per_s"]) for r in rows)))
PY
done
cd $OUT && tar czf s7.tgz s7 && rm -rf s7
