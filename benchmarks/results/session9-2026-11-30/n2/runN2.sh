#!/bin/bash
# session 9, call 2 (2x H200): what is alive at the capture step's memory peak (--memory-step 3: steps 1-2 run
# eagerly, step 3 captures) for quality plans that peaked above (TP2, PP2, DP2 ZeRO-2) or below (DP2 ZeRO-1) the
# planner's memory prediction in n1; TP2 also with TORCH_NCCL_AVOID_RECORD_STREAMS=1 and eagerly
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/n2; mkdir -p $R; date -u > $R/date.txt; cp gpu/runN2.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
Q=benchmarks/validation/quality/plans
for p in gpt-1.3b-r42 llama-1b-gqa-r36 llama-1b-gqa-r39 gpt-1.3b-r01; do
  f=$(ls $Q/q-$p-*.json); SECONDS=0
  timeout 70 python -m torch.distributed.run --nproc-per-node 2 -m runtime.train --plan $f --steps 5 --device cuda --memory-step 3 --memory-out $R/mem-$p --results $R/steps-$p.csv > $R/log-$p.txt 2>&1; echo "$p rc=$? ${SECONDS}s"
  python - $R/mem-$p.rank0.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); print({k: d[k] for k in ("baseline_mib", "peak_mib", "allocated_in_step_at_peak_mib")})
for r in d["at_peak"][:8]: print("  ", r["mib"], r["tensors"], r["site"][:150])
PY
done
cp $Q/q-gpt-1.3b-r42-*.json $R/tp2.json
python - $R/tp2.json $R/tp2-eager.json <<'PY'
import sys; from dataclasses import replace; from pathlib import Path; from planner.plan import Plan
p = Plan.load(Path(sys.argv[1])); replace(p, layout=replace(p.layout, cuda_graph=False)).save(Path(sys.argv[2]))
PY
SECONDS=0; TORCH_NCCL_AVOID_RECORD_STREAMS=1 timeout 60 python -m runtime.validate $R/tp2.json --steps 6 --warmup 3 --append $R/avoid.csv > $R/avoid.log 2>&1; echo "avoid rc=$? ${SECONDS}s"; grep -E "peak memory|step time" $R/avoid.log
SECONDS=0; timeout 60 python -m runtime.validate $R/tp2-eager.json --steps 6 --warmup 3 --append $R/eager.csv > $R/eager.log 2>&1; echo "eager rc=$? ${SECONDS}s"; grep -E "peak memory|step time" $R/eager.log
cd $OUT && tar czf n2.tgz n2 && rm -rf n2
