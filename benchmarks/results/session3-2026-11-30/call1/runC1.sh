#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/c1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runC1.sh gpu/commit $R/
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
echo "== ce check"; timeout 60 python gpu/ce_check.py 2>&1 | tail -4 | tee $R/ce_check.txt
echo "== ours"; timeout 200 python -m runtime.validate gpu/gpt13-tp1.json gpu/gpt67-tp1.json gpu/gpt67-tp2.json gpu/gpt13-dp2.json --steps 12 --warmup 4 --append $R/bars.csv > $R/bars.log 2>&1; echo rc=$?; grep -E "step time|plan:|memory" $R/bars.log | head -30
echo "== anchors"; (cd anchors; timeout 60 python gpt_step_anchor.py torch 24 2048 16 2048 4; timeout 120 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile; PYTHONPATH=/tmp/site timeout 90 torchrun --nproc_per_node=1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4 2>&1 | grep anchor; PYTHONPATH=/tmp/site timeout 100 torchrun --nproc_per_node=2 gpt_step_anchor.py mcore 2 32 4096 32 2048 2 2>&1 | grep anchor) > $R/anchors.jsonl 2>$R/anchors.err; cat $R/anchors.jsonl
echo "== traces"; timeout 100 torchrun --standalone --nproc-per-node 2 -m runtime.train --plan gpu/gpt67-tp2.json --steps 6 --trace-step 5 --trace-out $R/trace-gpt67-tp2.txt --device cuda > $R/trace.log 2>&1; echo rc=$?; grep -i exposed $R/trace-gpt67-tp2.txt $R/trace.log | head
timeout 80 torchrun --standalone --nproc-per-node 1 -m runtime.train --plan gpu/gpt13-tp1.json --steps 6 --trace-step 5 --trace-out $R/trace-gpt13-tp1.txt --device cuda > $R/trace1.log 2>&1; echo rc=$?; head -40 $R/trace-gpt13-tp1.txt | cut -c1-60,100-175
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
