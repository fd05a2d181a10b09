#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
mkdir -p $OUT/a; date -u > $OUT/a/date.txt; cp gpu/runA.sh $OUT/a/
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
echo "== cuda test"; timeout 60 python -m pytest -q tests/runtime/test_optimizer.py -k cuda 2>&1 | tail -2
echo "== ours"; timeout 220 python -m runtime.validate gpu/gpt13-tp1.json gpu/gpt67-tp1.json gpu/gpt67-tp2.json gpu/gpt13-dp2.json --steps 12 --warmup 4 --append $OUT/a/bars.csv > $OUT/a/bars.log 2>&1; echo rc=$?; grep -E "^---|step time|optimizer|^step 12|plan:" $OUT/a/bars.log
echo "== anchors"; (cd anchors; timeout 60 python gpt_step_anchor.py torch 24 2048 16 2048 4; timeout 120 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile; PYTHONPATH=/tmp/site timeout 90 torchrun --nproc_per_node=1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4 2>&1 | grep anchor; PYTHONPATH=/tmp/site timeout 100 torchrun --nproc_per_node=2 gpt_step_anchor.py mcore 2 32 4096 32 2048 2 2>&1 | grep anchor) > $OUT/a/anchors.jsonl 2>$OUT/a/anchors.err; cat $OUT/a/anchors.jsonl
echo "== trace"; timeout 100 torchrun --standalone --nproc-per-node 2 -m runtime.train --plan gpu/gpt67-tp2.json --steps 6 --trace-step 5 --trace-out $OUT/a/trace-gpt67-tp2.txt --device cuda > $OUT/a/trace.log 2>&1; echo rc=$?; tail -2 $OUT/a/trace-gpt67-tp2.txt
cd $OUT && tar czf a.tgz a && rm -rf a
