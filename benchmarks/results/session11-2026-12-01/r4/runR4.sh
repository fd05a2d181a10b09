#!/bin/bash
# session 11, call r4 (one GPU): the profile's elementwise part at the current runtime (bias-GELU kernels included),
# a traced GPT-1.3B step (the kernel table after the bias-GELU fusion), the 12 one-GPU validation plans
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/r4; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR4.sh gpu/elem_part.py gpu/mkbf16.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
CUDA_VISIBLE_DEVICES=0 timeout 90 python gpu/elem_part.py $R/elementwise-part.json > $R/elem.log 2>&1; echo "elem rc=$?"; tail -20 $R/elem.log
python gpu/mkbf16.py $R/plans > /dev/null
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 60 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-fp32.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-gpt13-tp1-graph.txt > $R/trace.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-gpt13-tp1-graph.txt
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 STEPS=6 WARMUP=3 OUT=$R/v1 bash benchmarks/validation/1gpu/run.sh > $R/v1.out 2>&1; echo "1gpu set rc=$? ${SECONDS}s"; wc -l < $R/v1/validation.csv
head -30 $R/trace-gpt13-tp1-graph.txt | cut -c1-100,170-200
cd $OUT && tar czf r4.tgz r4 && rm -rf r4
