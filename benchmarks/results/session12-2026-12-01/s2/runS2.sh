#!/bin/bash
# session 12, call s2 (one GPU): the MoE row kernels and in-place expert weights/gradients: CUDA tests, the EP bar's
# MoE and dense twin on one GPU (eager, as the bar runs them, and as CUDA graphs), a kernel table of the MoE step
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s2; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS2.sh gpu/mkgraphplans.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 120 python -m pytest -q -x tests/runtime/test_moe_rows.py tests/parallel/test_expert.py > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log
SECONDS=0; timeout 200 python benchmarks/parallel_bars.py --only ep --gpus 1 --steps 8 --out $R/bars --plans-dir $R/plans > $R/bars.out 2>&1; echo "bars rc=$? ${SECONDS}s"; tail -3 $R/bars.out
python gpu/mkgraphplans.py $R/plans $R/plans dense1 moe1
for t in dense1-graph moe1-graph; do SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/$t.json --steps 16 --device cuda --results $R/$t.csv > $R/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s"; tail -2 $R/$t.log | cut -c1-150
done
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/moe1.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-moe1.txt > $R/trace-moe1.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-moe1.txt; head -34 $R/trace-moe1.txt | cut -c1-90,170-215
cd $OUT && tar czf s2.tgz s2 && rm -rf s2
