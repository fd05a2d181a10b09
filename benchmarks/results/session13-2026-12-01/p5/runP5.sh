#!/bin/bash
# session 13, call p5 (one GPU): the router backward on tensor cores: its CUDA tests and the MoE's; the EP bar's
# MoE on one GPU (session 12's moe1-graph plan, 16 steps) on the tree before (gpu/prev) and after, alternated, and its
# dense twin once
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/p5; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP5.sh gpu/commit $R/; cp gpu/prev/commit $R/prev-commit; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 120 python -m pytest -q tests/parallel/test_expert.py -k "cuda" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log
P=$PWD/benchmarks/results/session12-2026-12-01/s9/plans
run() {  # tree tag plan
  SECONDS=0; (cd $1 && PLAN_COMMIT=$(cat $( [ $1 = . ] && echo gpu/commit || echo commit)) PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/$3.json --steps 16 --device cuda --results $R/$2.csv > $R/$2.log 2>&1); echo "$2 rc=$? ${SECONDS}s"
  python - $R/$2.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
print(sys.argv[1].split("/")[-1], round(statistics.median(float(r["step_s"]) for r in rows), 5), round(statistics.median(float(r["tokens_per_s"]) for r in rows)))
PY
}
run gpu/prev moe1-prev-a moe1-graph; run . moe1-new-a moe1-graph; run gpu/prev moe1-prev-b moe1-graph; run . moe1-new-b moe1-graph; run . dense1-new dense1-graph
cd $OUT && tar czf p5.tgz p5 && rm -rf p5
