#!/bin/bash
# session 8, call 4 (2x H200): graph equivalence tests (MoE at EP1 added); the sweep with MoE EP1 replayed too, as a
# second held-out set for the profile calibrated on call 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/m4; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runM4.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; uptime > $R/uptime.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
SECONDS=0; STEPS=8 WARMUP=3 OUT=$R/c2 PROFILE=profiles/h200-sxm.json timeout 200 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; STEPS=8 WARMUP=3 CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=profiles/h200-sxm.json timeout 120 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
SECONDS=0; timeout 200 python -m pytest -q -x tests/runtime/test_graph.py -k replayed > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -3 $R/pytest.log
wc -l $R/*/validation.csv
cd $OUT && tar czf m4.tgz m4 && rm -rf m4
