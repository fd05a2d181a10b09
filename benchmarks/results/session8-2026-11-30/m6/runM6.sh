#!/bin/bash
# session 8, call 6 (2x H200): warm-up steps on the capture's side stream; MoE at EP1 captured (equivalence test,
# plus the dense TP1 case again), and the four MoE EP1 plans of the sweep replayed
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/m6; mkdir -p $R/c1 $R/c2; date -u > $R/date.txt; cp gpu/runM6.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
SECONDS=0; timeout 80 python -m pytest -q -x tests/runtime/test_graph.py -k "True or 1-1-1-none-False" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log; grep -E "^E .*(rror|capture)" $R/pytest.log | head -5
V=benchmarks/validation
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 50 python -m runtime.validate $V/1gpu/plans/09-*.json $V/1gpu/plans/10-*.json --steps 8 --warmup 3 --profile profiles/h200-sxm.json --append $R/c1/validation.csv > $R/c1/validation.log 2>&1; echo "1gpu rc=$? ${SECONDS}s"
SECONDS=0; timeout 60 python -m runtime.validate $V/2gpu/plans/18-*.json $V/2gpu/plans/19-*.json --steps 8 --warmup 3 --profile profiles/h200-sxm.json --append $R/c2/validation.csv > $R/c2/validation.log 2>&1; echo "2gpu rc=$? ${SECONDS}s"
grep -hE "step time|peak memory|rror" $R/c1/validation.log $R/c2/validation.log | head -12
cd $OUT && tar czf m6.tgz m6 && rm -rf m6
