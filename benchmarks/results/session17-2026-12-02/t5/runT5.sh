#!/bin/bash
# session 17, call t5 (one GPU): Qwen3's q/k norms as one Triton kernel each way (runtime/qk_norm.py): its CUDA tests
# and the model's; t3's three qwen3-8b-8l plans again, re-planned at this tree (fidelity-s17/plans-qk-fused); a
# traced step at micro-batch 1.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/t5; mkdir -p $R/val; date -u > $R/date.txt; cp runT5.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 150 python -m pytest -q -p no:cacheprovider tests/runtime/test_qk_norm.py tests/runtime/test_model.py tests/runtime/test_norm.py > $R/cuda-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; head -3 $R/cuda-tests.log; grep -E "^(FAILED|ERROR)" $R/cuda-tests.log | head
P=benchmarks/validation/fidelity-s17/plans-qk-fused
SECONDS=0; timeout 150 python -m runtime.validate $P/*.json --steps 12 --warmup 6 --device cuda --timeout 140 --append $R/val/validation.csv > $R/val/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/val/validation.csv
SECONDS=0; timeout 60 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/01-qwen3-8l-mb1-none.json --steps 8 --device cuda --trace-step 7 --trace-out $R/trace-01-qwen3-8l-mb1-none.txt > $R/train.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-01-qwen3-8l-mb1-none.txt
cd $OUT && tar czf t5.tgz t5 && rm -rf t5
