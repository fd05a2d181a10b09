#!/bin/bash
# session 9, call 1 (2x H200): plan quality re-measured with CUDA graphs (benchmarks/validation/quality, 100 plans
# regenerated at this tree), then kernel tables of GPT-1.3B on one GPU: ours replayed, and the torch.compile anchor
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/n1; mkdir -p $R/q; date -u > $R/date.txt; cp gpu/runN1.sh gpu/anchor_trace.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
SECONDS=0; STEPS=6 WARMUP=3 OUT=$R/q PLAN_TIMEOUT=40 timeout 470 bash benchmarks/validation/quality/run.sh > $R/q/run.out 2>&1; echo "quality rc=$? ${SECONDS}s"; tail -1 $R/q/validation.log; wc -l $R/q/validation.csv
python gpu/mkgraph.py $R/plans > /dev/null
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 60 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-graph.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-gpt13-tp1-graph.txt > $R/trace.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-gpt13-tp1-graph.txt
SECONDS=0; CUDA_VISIBLE_DEVICES=1 timeout 100 python gpu/anchor_trace.py $R/trace-anchor-compile.txt > $R/anchor.log 2>&1; echo "anchor rc=$? ${SECONDS}s"; tail -2 $R/anchor.log; tail -1 $R/trace-anchor-compile.txt
cd $OUT && tar czf n1.tgz n1 && rm -rf n1
