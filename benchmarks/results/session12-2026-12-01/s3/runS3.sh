#!/bin/bash
# session 12, call s3 (one GPU): the moe_rows kernels' tests again (interpreter fix), the EP bar's MoE and dense twin
# on one GPU, and the 12 one-GPU validation plans at this runtime (the MoE's cost terms changed)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/s3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runS3.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 120 python -m pytest -q tests/runtime/test_moe_rows.py tests/parallel/test_expert.py > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -1 $R/pytest.log
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 STEPS=6 WARMUP=3 OUT=$R/v1 bash benchmarks/validation/1gpu/run.sh > $R/v1.out 2>&1; echo "1gpu set rc=$? ${SECONDS}s"; cut -d, -f1,9,11-16 $R/v1/validation.csv
SECONDS=0; timeout 150 python benchmarks/parallel_bars.py --only ep --gpus 1 --steps 8 --out $R/bars > $R/bars.out 2>&1; echo "bars rc=$? ${SECONDS}s"; tail -3 $R/bars.out
cd $OUT && tar czf s3.tgz s3 && rm -rf s3
