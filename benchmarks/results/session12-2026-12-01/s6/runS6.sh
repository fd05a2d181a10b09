#!/bin/bash
# session 12, call s6 (one GPU): the fused qkv rotary (runtime/rotary.py): CUDA tests (whole models too), the profile's
# elementwise part again (rotary as the runtime now runs it), the EP bar's Llama-style dense twin and MoE, eager and as graphs
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s6; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS6.sh gpu/elem_part.py gpu/mkgraphplans.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python -m pytest -q tests/runtime -k "cuda" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 120 python gpu/elem_part.py $R/elementwise-part.json > $R/elem.log 2>&1; echo "elem rc=$? ${SECONDS}s"; grep "rotary\|swiglu" $R/elem.log
SECONDS=0; timeout 150 python benchmarks/parallel_bars.py --only ep --gpus 1 --steps 8 --out $R/bars --plans-dir $R/plans > $R/bars.out 2>&1; echo "bars rc=$? ${SECONDS}s"; tail -2 $R/bars.out
python gpu/mkgraphplans.py $R/plans $R/plans dense1 moe1 > /dev/null
for t in dense1-graph moe1-graph; do SECONDS=0
  CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/$t.json --steps 16 --device cuda --results $R/$t.csv > $R/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s"; tail -1 $R/$t.log | cut -c1-120
done
# the same dense twin on the tree before the fused rotary (1cc54a4, gpu/prev), same call
SECONDS=0; (cd gpu/prev && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/dense1-graph.json --steps 16 --device cuda --results $R/dense1-graph-prev.csv > $R/dense1-graph-prev.log 2>&1); echo "dense1-graph-prev rc=$? ${SECONDS}s"; tail -1 $R/dense1-graph-prev.log | cut -c1-120
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/dense1-graph.json --steps 16 --device cuda --results $R/dense1-graph-b.csv > $R/dense1-graph-b.log 2>&1; echo "dense1-graph-b rc=$? ${SECONDS}s"; tail -1 $R/dense1-graph-b.log | cut -c1-120
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 90 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/dense1-graph.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-dense1-graph.txt > $R/trace-dense1.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-dense1-graph.txt; head -24 $R/trace-dense1-graph.txt | cut -c1-90,170-215
cd $OUT && tar czf s6.tgz s6 && rm -rf s6
