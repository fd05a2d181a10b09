#!/bin/bash
# session 8, call 5 (2x H200): pipeline steps as CUDA graphs (equivalence tests PP2 1F1B and interleaved), the MoE
# capture probe, and the 2-GPU sweep with the pipeline plans replayed (held out of the m2 calibration)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/m5; mkdir -p $R/c2; date -u > $R/date.txt; cp gpu/runM5.sh gpu/moe_probe.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt; uptime > $R/uptime.txt; grep -m1 "model name" /proc/cpuinfo > $R/cpu.txt
SECONDS=0; timeout 110 python -m pytest -q -x tests/runtime/test_graph.py -k "1-2-1-none or 1-2-2-none" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log
SECONDS=0; timeout 100 python gpu/moe_probe.py > $R/moe_probe.log 2>&1; echo "probe rc=$? ${SECONDS}s"; grep -v Warn $R/moe_probe.log | head -30
SECONDS=0; STEPS=8 WARMUP=3 OUT=$R/c2 PROFILE=profiles/h200-sxm.json timeout 200 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
wc -l $R/*/validation.csv
cd $OUT && tar czf m5.tgz m5 && rm -rf m5
