#!/bin/bash
# session 10, two-GPU call: issue 4's TP2 / DP2 bars with Megatron-Core TP2 in the same call; the four FSDP plans
# after the fused-AdamW change; a traced TP2 step (exposed TP communication)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/q; mkdir -p $R; date -u > $R/date.txt; cp gpu/runQ.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
python gpu/mkgraph.py $R/plans > /dev/null
SECONDS=0; timeout 110 python -m runtime.validate $R/plans/gpt67-tp1-graph.json $R/plans/gpt67-tp2-graph.json $R/plans/gpt13-tp1-graph.json $R/plans/gpt13-dp2-graph.json --steps 9 --warmup 3 --append $R/bars.csv > $R/bars.log 2>&1; echo "bars rc=$? ${SECONDS}s"; cut -d, -f1-9,13-16 $R/bars.csv
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl 2>&1 | tail -1
SECONDS=0; (cd anchors; PYTHONPATH=$PWD/../.site timeout 70 python -m torch.distributed.run --nproc-per-node 2 gpt_step_anchor.py mcore 2 32 4096 32 2048 2) > $R/anchors.jsonl 2>$R/anchors.err; echo "mcore tp2 rc=$? ${SECONDS}s"; cut -c1-220 $R/anchors.jsonl
mkdir -p $R/fsdp; SECONDS=0; timeout 75 python -m runtime.validate gpu/fsdp/gpt-dp2-full-mb4.json gpu/fsdp/gpt-dp2-full-mb1.json gpu/fsdp/llama-dp2-full-mb4.json gpu/fsdp/llama-dp2-full-mb1.json --steps 6 --warmup 3 --timeout 25 --append $R/fsdp/validation.csv > $R/fsdp/validation.log 2>&1; echo "fsdp rc=$? ${SECONDS}s"; cut -d, -f1-9,13-16 $R/fsdp/validation.csv
SECONDS=0; timeout 45 python -m torch.distributed.run --nproc-per-node 2 -m runtime.train --plan $R/plans/gpt67-tp2-graph.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-gpt67-tp2-graph.txt > $R/trace.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-gpt67-tp2-graph.txt
cd $OUT && tar czf q.tgz q && rm -rf q
