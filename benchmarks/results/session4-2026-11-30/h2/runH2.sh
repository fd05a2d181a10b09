#!/bin/bash
# session 4, call 2 (2x H200): runtime bars with anchors in the same call, traces
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/h2; mkdir -p $R; date -u > $R/date.txt; cp gpu/runH2.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; nvidia-smi topo -m >> $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
echo "== ours"; timeout 200 python -m runtime.validate gpu/gpt13-tp1.json gpu/gpt67-tp1.json gpu/gpt67-tp2.json gpu/gpt13-dp2.json --steps 14 --warmup 4 --append $R/bars.csv > $R/bars.log 2>&1; echo rc=$?; grep -E "step time|plan:|memory" $R/bars.log | head -30
echo "== anchors"; (cd anchors; timeout 60 python gpt_step_anchor.py torch 24 2048 16 2048 4; timeout 120 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile; PYTHONPATH=/tmp/site timeout 90 torchrun --nproc_per_node=1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4 2>&1 | grep anchor; PYTHONPATH=/tmp/site timeout 100 torchrun --nproc_per_node=2 gpt_step_anchor.py mcore 2 32 4096 32 2048 2 2>&1 | grep anchor) > $R/anchors.jsonl 2>$R/anchors.err; cat $R/anchors.jsonl
echo "== traces"; timeout 100 torchrun --standalone --nproc-per-node 2 -m runtime.train --plan gpu/gpt67-tp2.json --steps 7 --trace-step 6 --trace-out $R/trace-gpt67-tp2.txt --device cuda > $R/trace.log 2>&1; echo rc=$?; grep -i exposed $R/trace-gpt67-tp2.txt | head -3; grep "^step" $R/trace.log | cut -c1-80
timeout 80 torchrun --standalone --nproc-per-node 1 -m runtime.train --plan gpu/gpt13-tp1.json --steps 7 --trace-step 6 --trace-out $R/trace-gpt13-tp1.txt --device cuda > $R/trace1.log 2>&1; echo rc=$?; tail -1 $R/trace-gpt13-tp1.txt; grep "^step" $R/trace1.log | cut -c1-80
cd $OUT && tar czf h2.tgz h2 && rm -rf h2
