#!/bin/bash
# session 4, call 1 (one H200): runtime 1.3B bar with anchors, trace, bias-grad microbench, profile accuracy
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/h1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runH1.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
echo "== bias bench"; timeout 60 python gpu/bias_bench.py 2>&1 | tee $R/bias_bench.txt
echo "== ours"; timeout 150 python -m runtime.validate gpu/gpt13-tp1.json gpu/gpt67-tp1.json --steps 14 --warmup 4 --append $R/bars.csv > $R/bars.log 2>&1; echo rc=$?; grep -E "step time|plan:|memory" $R/bars.log | head -30
echo "== anchors"; (cd anchors; timeout 60 python gpt_step_anchor.py torch 24 2048 16 2048 4; timeout 120 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile; PYTHONPATH=/tmp/site timeout 90 torchrun --nproc_per_node=1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4 2>&1 | grep anchor) > $R/anchors.jsonl 2>$R/anchors.err; cat $R/anchors.jsonl
echo "== trace"; timeout 80 torchrun --standalone --nproc-per-node 1 -m runtime.train --plan gpu/gpt13-tp1.json --steps 7 --trace-step 6 --trace-out $R/trace-gpt13-tp1.txt --device cuda > $R/trace1.log 2>&1; echo rc=$?; tail -3 $R/trace-gpt13-tp1.txt; grep "^step" $R/trace1.log | cut -c1-80
echo "== profile accuracy"; timeout 200 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --gemm-shapes 300 --skip collectives > $R/acc.log 2>&1; echo rc=$?; tail -5 $R/acc.log
cd $OUT && tar czf h1.tgz h1 && rm -rf h1
