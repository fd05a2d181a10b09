#!/bin/bash
# session 8, call 1 (2x H200): CUDA-graph steps (runtime/graph.py): equivalence tests on CUDA, then eager vs graph
# on the issue-4 bar plans (1 GPU, TP2, DP2), a CP2 plan, and a device trace of GPT 6.7B TP2 replayed
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/m1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runM1.sh gpu/mkgraph.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
PYTHONPATH=$PWD python gpu/mkgraph.py $R/plans
echo "== pytest"; SECONDS=0; timeout 200 python -m pytest -q -x tests/runtime/test_graph.py -k replayed > $R/pytest.log 2>&1; echo "rc=$? ${SECONDS}s"; tail -25 $R/pytest.log | grep -vE "^\s*$" | tail -15
P=$R/plans
echo "== 1 GPU"; SECONDS=0; timeout 150 python -m runtime.validate $P/gpt13-tp1-eager.json $P/gpt13-tp1-graph.json $P/gpt67-tp1-graph.json --steps 14 --warmup 4 --append $R/val.csv > $R/val1.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "plan|step time|peak memory|rror" $R/val1.log | head -20
echo "== 2 GPU"; SECONDS=0; timeout 240 python -m runtime.validate $P/gpt13-tp2mb4-eager.json $P/gpt13-tp2mb4-graph.json $P/gpt13-tp2mb1-eager.json $P/gpt13-tp2mb1-graph.json $P/gpt13-dp2-graph.json $P/gpt67-tp2-graph.json $P/gpt13-cp2-graph.json --steps 10 --warmup 4 --append $R/val.csv > $R/val2.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "plan|step time|peak memory|rror" $R/val2.log | head -40
echo "== trace"; SECONDS=0; timeout 80 python -m torch.distributed.run --nproc-per-node 2 -m runtime.train --plan $P/gpt67-tp2-graph.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-gpt67-tp2-graph.txt > $R/trace.log 2>&1; echo "rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-gpt67-tp2-graph.txt; tail -3 $R/trace.log
cd $OUT && tar czf m1.tgz m1 && rm -rf m1
