#!/bin/bash
# session 10, call 8 (one GPU): the fused norms inside whole models on CUDA (tests/runtime/test_norm.py)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p8; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP8.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 300 python -m pytest -q -rs tests/runtime/test_norm.py > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -15 $R/pytest.log
cd $OUT && tar czf p8.tgz p8 && rm -rf p8
