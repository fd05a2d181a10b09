#!/bin/bash
# session 12, call s9 (one GPU): the final tree's CUDA tests (runtime, MoE) and the EP bar's two models as graphs
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s9; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS9.sh gpu/mkgraphplans.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python -m pytest -q tests/runtime tests/parallel/test_expert.py -k "(cuda or flat_buffers or grouped) and not interpreted" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log
SECONDS=0; timeout 150 python benchmarks/parallel_bars.py --only ep --gpus 1 --steps 8 --out $R/bars --plans-dir $R/plans > $R/bars.out 2>&1; echo "bars rc=$? ${SECONDS}s"; tail -2 $R/bars.out
python gpu/mkgraphplans.py $R/plans $R/plans dense1 moe1 > /dev/null
for t in dense1-graph moe1-graph; do SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/$t.json --steps 16 --device cuda --results $R/$t.csv > $R/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s"
  python - $R/$t.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
print(sys.argv[1].split("/")[-1], round(statistics.median(float(r["step_s"]) for r in rows), 5), round(statistics.median(float(r["tokens_per_s"]) for r in rows)))
PY
done
cd $OUT && tar czf s9.tgz s9 && rm -rf s9
