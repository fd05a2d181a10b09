#!/bin/bash
# session 14, call q1 (one GPU), from committed trees only (gpu/new = HEAD, gpu/prev = 33d0f7d):
#  1. the MoE's and the power cap's CUDA tests on the new tree (chunked-dispatch code path, EP1 on one GPU)
#  2. profile_accuracy against the shipped measured profile with the held-out GEMMs and attention cases timed
#     in three passes (issue 3), and the layer check
#  3. the EP bar's MoE on one GPU (moe1-graph, 16 steps) before (33d0f7d) and after, alternated, and the dense twin
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=$OUT/q1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runQ1.sh $R/; cp gpu/new/commit $R/commit; cp gpu/prev/commit $R/prev-commit
nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 200 > $R/clocks.csv &
MON=$!
cd gpu/new
SECONDS=0; PYTHONPATH=$PWD timeout 150 python -m pytest -q tests/parallel/test_expert.py tests/profiler/test_power_cap.py -k "cuda or power" -p no:cacheprovider > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log
SECONDS=0; PYTHONPATH=$PWD timeout 300 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --skip fp8,collectives --passes 3 > $R/acc.log 2>&1; echo "acc rc=$? ${SECONDS}s"; tail -4 $R/acc.log | cut -c1-400
cd ../..
P=$PWD/gpu/new/benchmarks/results/session12-2026-12-01/s9/plans
run() {  # tree tag plan
  SECONDS=0; (cd gpu/$1 && PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/$3.json --steps 16 --device cuda --results $R/$2.csv > $R/$2.log 2>&1); echo "$2 rc=$? ${SECONDS}s"
  python - $R/$2.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) >= 4]
print(sys.argv[1].split("/")[-1], round(statistics.median(float(r["step_s"]) for r in rows), 5), round(statistics.median(float(r["tokens_per_s"]) for r in rows)), rows[-1]["loss"])
PY
}
run prev moe1-prev-a moe1-graph; run new moe1-new-a moe1-graph; run prev moe1-prev-b moe1-graph; run new moe1-new-b moe1-graph; run new dense1-new dense1-graph
kill $MON
cd $OUT && tar czf q1.tgz q1 && rm -rf q1
