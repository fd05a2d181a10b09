#!/bin/bash
# session 11, call r5 (one GPU): tune the bias-GELU backward kernel (gpu/tune_bias_gelu.py)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r5; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR5.sh gpu/tune_bias_gelu.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python gpu/tune_bias_gelu.py $R/tune.json > $R/tune.log 2>&1; echo "tune rc=$? ${SECONDS}s"; grep -v '"cfg"' $R/tune.log | cut -c1-600; sort -t: -k6 -n $R/tune.log | head -3 >/dev/null
python3 - $R/tune.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
for shape in sorted({(r["rows"], r["n"]) for r in rows}):
    rs = sorted((r for r in rows if (r["rows"], r["n"]) == shape), key=lambda r: r["us"])
    print(shape, [(r["cfg"], r["us"]) for r in rs[:6]])
PY
cd $OUT && tar czf r5.tgz r5 && rm -rf r5
