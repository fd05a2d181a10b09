#!/bin/bash
# session 6, call 6 (one H200): FP8 quantisation eager vs fused, a layer GEMM bf16 vs FP8; GPT 1.3B and 6.7B
# (one GPU) bf16 against FP8 through plan validate with the shipped profile
export PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/k6; mkdir -p $R; date -u > $R/date.txt; cp gpu/runK6.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 60 python benchmarks/fp8_quantize.py --out $R/fp8_quantize.json > $R/fp8_quantize.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -v Warn $R/fp8_quantize.log | tr -d '\n ' | cut -c1-700; echo
SECONDS=0; timeout 150 python -m runtime.validate gpu/gpt13-tp1.json gpu/gpt13-tp1-fp8.json gpu/gpt67-tp1.json gpu/gpt67-tp1-fp8.json --steps 12 --warmup 4 --append $R/fp8.csv > $R/fp8.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "step time|peak memory|rror" $R/fp8.log | head -12
cd $OUT && tar czf k6.tgz k6 && rm -rf k6
