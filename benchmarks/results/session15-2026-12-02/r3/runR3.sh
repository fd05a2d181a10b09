#!/bin/bash
# session 15, call r3 (one GPU): a third machine for r2's finding. This machine's single-rank host figures
# (runtime.profiler.host on one GPU, which now measures those only), then the four eager plans validated with the
# default profile carrying them (14 steps, 8 warm-up), and the runtime's GPU-only tests at this tree
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/r3; mkdir -p $R/eager; date -u > $R/date.txt; cp runR3.sh commit $R/; nvidia-smi -L > $R/gpu.txt
(lscpu | grep -E "Model name|^CPU\(s\)"; uptime) > $R/cpu.txt 2>&1
SECONDS=0; timeout 120 python -m runtime.profiler.host --profile profiles/h200-sxm-calibrated.json --out $R/host-single.json > $R/host-single.log 2>&1; echo "host rc=$? ${SECONDS}s"; head -3 $R/host-single.log
SECONDS=0; timeout 200 python -m runtime.validate $(ls benchmarks/validation/1gpu-s15/plans/*.json) --steps 14 --warmup 8 --device cuda --timeout 60 --profile $R/host-single.json --append $R/eager/validation.csv > $R/eager/validation.log 2>&1; echo "eager rc=$? ${SECONDS}s"
cut -d, -f1,9,11-16 $R/eager/validation.csv
SECONDS=0; timeout 240 python -m pytest -q -x -p no:cacheprovider tests/runtime/test_graph.py tests/runtime/test_bias_gelu.py tests/runtime/test_moe_rows.py tests/runtime/test_swiglu.py tests/runtime/test_rotary.py tests/runtime/test_optimizer.py tests/runtime/test_grouped_wgrad.py tests/runtime/test_norm.py tests/runtime/test_fp8.py tests/runtime/test_trace_analysis.py > $R/cuda-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -3 $R/cuda-tests.log
cd $OUT && tar czf r3.tgz r3 && rm -rf r3
