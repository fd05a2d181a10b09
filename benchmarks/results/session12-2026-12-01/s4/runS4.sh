#!/bin/bash
# session 12, call s4 (one GPU): the experts' weight gradient accumulated by the GEMM (runtime/grouped_wgrad.py):
# CUDA tests, the kernel against torch's grouped GEMM + add, the EP bar's MoE and dense twin (eager, graphs), a traced MoE step
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s4; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS4.sh gpu/bench_wgrad.py gpu/mkgraphplans.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 150 python -m pytest -q tests/runtime/test_grouped_wgrad.py tests/runtime/test_moe_rows.py tests/parallel/test_expert.py -k "not interpreted" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -1 $R/pytest.log
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 150 python gpu/bench_wgrad.py > $R/bench_wgrad.jsonl 2> $R/bench_wgrad.err; echo "bench rc=$? ${SECONDS}s"; cat $R/bench_wgrad.jsonl; tail -3 $R/bench_wgrad.err
SECONDS=0; timeout 150 python benchmarks/parallel_bars.py --only ep --gpus 1 --steps 8 --out $R/bars --plans-dir $R/plans > $R/bars.out 2>&1; echo "bars rc=$? ${SECONDS}s"; tail -2 $R/bars.out
python gpu/mkgraphplans.py $R/plans $R/plans dense1 moe1
for t in dense1-graph moe1-graph; do SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/$t.json --steps 16 --device cuda --results $R/$t.csv > $R/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s"; tail -1 $R/$t.log | cut -c1-150
done
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/moe1-graph.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-moe1-graph.txt > $R/trace-moe1.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-moe1-graph.txt; head -30 $R/trace-moe1-graph.txt | cut -c1-90,170-215
cd $OUT && tar czf s4.tgz s4 && rm -rf s4
