#!/bin/bash
# session 13, call p7 (one GPU): plan validate with the GPU monitor (two one-GPU plans); the layer check (TP1) and
# the heater's CUDA tests after timing.back_to_back_s replaced their own loops
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p7; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP7.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 90 python -m runtime.validate benchmarks/validation/1gpu/plans/04-gpt13-mb4-none.json benchmarks/validation/1gpu-s13/plans/13-gpt13b6l-mb2-none.json --steps 12 --warmup 4 --device cuda --timeout 40 --append $R/v/validation.csv > $R/validate.log 2>&1; echo "validate rc=$? ${SECONDS}s"; grep -n "GPU during\|step time" $R/validate.log; cat $R/v/validation.plans.jsonl | python -c "import sys, json; [print(json.loads(l).get('gpu_state')) for l in sys.stdin]"
SECONDS=0; timeout 60 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $R/acc --gpus 1 --skip gemm,fp8,attention,collectives > $R/acc.log 2>&1; echo "layer rc=$? ${SECONDS}s"; cut -d, -f1-6,11-13 $R/acc/layer.csv
SECONDS=0; timeout 60 python -m pytest -q tests/profiler/test_power_cap.py > $R/pytest.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $R/pytest.log
cd $OUT && tar czf p7.tgz p7 && rm -rf p7
