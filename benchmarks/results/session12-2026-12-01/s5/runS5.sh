#!/bin/bash
# session 12, call s5 (one GPU): tile / pipeline sweep of the grouped weight-gradient kernel, pointer and block-pointer forms
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/s5; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS5.sh gpu/tune_wgrad.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 400 python gpu/tune_wgrad.py > $R/tune.jsonl 2> $R/tune.err; echo "tune rc=$? ${SECONDS}s"; tail -3 $R/tune.err
python - $R/tune.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in sorted([r for r in rows if "s" in r], key=lambda r: (r["n"], r["s"]))[:60]:
    print(r["variant"], r["n"], r["k"], r.get("cfg"), f'{r["s"]*1e3:.3f} ms', f'{r["tflops"]:.0f} TF', f'{r.get("rel_err", 0):.1e}')
PY
cd $OUT && tar czf s5.tgz s5 && rm -rf s5
