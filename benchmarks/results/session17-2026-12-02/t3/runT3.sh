#!/bin/bash
# session 17, call t3 (one GPU): after the model-fidelity changes (attention biases, rotary base / norm epsilon /
# Llama 3.1 rope scaling, Qwen3's q/k norms): the runtime's CUDA tests;
# `plan profile --model qwen3-8b-8l,qwen2-7b-8l --base h200-sxm-calibrated`; six one-GPU
# plans of benchmarks/validation/fidelity-s17 validated (qwen3 with q/k norms, qwen2 with q/k/v biases, llama3-8b-8l
# at theta 500000). Clocks every 100 ms.
# OR-Tools could not travel this call (the tree with its wheel was over 64 MiB): tests that plan fail on its import
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/t3; mkdir -p $R/val; date -u > $R/date.txt; cp runT3.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 230 python -m pytest -q -p no:cacheprovider tests/runtime/test_graph.py tests/runtime/test_rotary.py tests/runtime/test_norm.py tests/runtime/test_bias_gelu.py tests/runtime/test_swiglu.py tests/runtime/test_optimizer.py tests/runtime/test_model.py > $R/cuda-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -2 $R/cuda-tests.log
M=benchmarks/models
SECONDS=0; timeout 100 python -m runtime.profiler.cli --model $M/qwen3-8b-8l/config.json,$M/qwen2-7b-8l/config.json --base h200-sxm-calibrated --out $R/h200-sxm-calibrated-qwen.json --no-progress --budget 80 > $R/extend.log 2>&1; echo "extend rc=$? ${SECONDS}s"; tail -2 $R/extend.log
SECONDS=0; timeout 220 python -m runtime.validate benchmarks/validation/fidelity-s17/plans/*.json --steps 12 --warmup 6 --device cuda --timeout 210 --append $R/val/validation.csv > $R/val/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/val/validation.csv
cd $OUT && tar czf t3.tgz t3 && rm -rf t3
