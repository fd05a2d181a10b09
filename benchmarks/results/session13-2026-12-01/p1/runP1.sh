#!/bin/bash
# session 13, call p1 (one GPU): burst against sustained times of GEMMs, a copy and three layers, with power/clocks
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP1.sh gpu/power_probe.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi -q -d POWER,CLOCK > $R/smi-q.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 20 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 300 python gpu/power_probe.py $R/probe.json > $R/probe.log 2>&1; echo "probe rc=$? ${SECONDS}s"
kill $SMI
python - <<'PY'
import json, os
for r in json.load(open(os.environ["OUT"] + "/p1/probe.json")):
    print(f"{r['name']:28s} n={r['iters']:6d} cold {r['burst_cold_s']*1e3:8.3f} first5 {r['first5_s']*1e3:8.3f} sustained {r['last_half_s']*1e3:8.3f} hot {r['burst_hot_s']*1e3:8.3f} ms  ratio {r['last_half_s']/r['burst_cold_s']:.3f}")
PY
tail -5 $R/probe.log
cd $OUT && tar czf p1.tgz p1 && rm -rf p1
