#!/bin/bash
# session 6, call 2 (2x H200): EP2 bar with the padded (no host sync) dispatch; FP8 vs bf16 for GPT 1.3B (one
# GPU) and 6.7B (TP1, TP2) through plan validate, with the plain-PyTorch anchors (eager, compile) in the same call
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/k2; mkdir -p $R; date -u > $R/date.txt; cp gpu/runK2.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
echo "== ep bar"; SECONDS=0; timeout 150 python benchmarks/parallel_bars.py --out $R/bars --only ep --budget-s 130 > $R/bars.out 2>&1; echo "rc=$? ${SECONDS}s"; tail -8 $R/bars/parallel_bars.log
echo "== ours bf16 / fp8"; SECONDS=0; timeout 230 python -m runtime.validate gpu/gpt13-tp1.json gpu/gpt13-tp1-fp8.json gpu/gpt67-tp1.json gpu/gpt67-tp1-fp8.json gpu/gpt67-tp2.json gpu/gpt67-tp2-fp8.json --steps 14 --warmup 4 --append $R/fp8.csv > $R/fp8.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "step time|plan:|memory|rror" $R/fp8.log | head -30
echo "== anchors"; SECONDS=0; (cd anchors; timeout 50 python gpt_step_anchor.py torch 24 2048 16 2048 4; timeout 110 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile) > $R/anchors.jsonl 2>$R/anchors.err; echo "${SECONDS}s"; cat $R/anchors.jsonl
cd $OUT && tar czf k2.tgz k2 && rm -rf k2
