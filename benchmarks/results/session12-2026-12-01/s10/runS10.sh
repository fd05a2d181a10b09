#!/bin/bash
# session 12, call s10 (one GPU): the final tree's one-GPU CUDA-graph tests (replayed steps against eager ones, MoE included)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/s10; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS10.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python -m pytest -q -rs tests/runtime/test_graph.py > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; grep -E "passed|failed|SKIPPED" $R/pytest.log | tail -6
cd $OUT && tar czf s10.tgz s10 && rm -rf s10
