#!/bin/bash
# session 12, call s1 (one GPU): the EP bar's MoE on one GPU against its dense twin (no all-to-all), with kernel
# tables of both steps; `plan profile --quick --model gpt-1.3b` on CUDA (first run of --model on a GPU)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s1; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS1.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python benchmarks/parallel_bars.py --only ep --gpus 1 --steps 8 --out $R/bars --plans-dir $R/plans > $R/bars.out 2>&1; echo "bars rc=$? ${SECONDS}s"; tail -4 $R/bars.out
for t in dense1 moe1; do SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/$t.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-$t.txt > $R/trace-$t.log 2>&1; echo "trace $t rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-$t.txt; head -30 $R/trace-$t.txt | cut -c1-90,170-215
done
SECONDS=0; timeout 240 python -m runtime.profiler.cli --quick --model gpt-1.3b --out $R/quick-gpt13.json > $R/profile.log 2>&1; echo "profile rc=$? ${SECONDS}s"; tail -15 $R/profile.log
cd $OUT && tar czf s1.tgz s1 && rm -rf s1
