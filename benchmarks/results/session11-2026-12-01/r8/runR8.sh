#!/bin/bash
# session 11, call r8 (one GPU): the qkv split's backward after the rows-per-program change, against the
# concatenation plus bias sum (gpu/bench_qkv_split.py); its CUDA tests
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=$OUT/r8; mkdir -p $R; date -u > $R/date.txt; cp gpu/runR8.sh gpu/bench_qkv_split.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
timeout 60 python gpu/bench_qkv_split.py > $R/bench.log 2>&1; echo "bench rc=$?"; cat $R/bench.log | tail -3
SECONDS=0; timeout 90 python -m pytest -q -x tests/runtime/test_qkv_split.py > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; grep -E "passed|failed|^E " $R/pytest.log | head -3; head -1 $R/pytest.log
cd $OUT && tar czf r8.tgz r8 && rm -rf r8
