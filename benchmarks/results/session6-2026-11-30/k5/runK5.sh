#!/bin/bash
# session 6, call 5 (2x H200): the FP8 kernels' CUDA check; full profile (GEMM grid on both GPUs, FP8 table
# through the fused quantisation), its accuracy, and the 34 predict-vs-measure cases against it, one machine
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit)
R=$OUT/k5; mkdir -p $R/c2 $R/c1; date -u > $R/date.txt; cp gpu/runK5.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 60 python -m pytest -q -x tests/runtime/test_fp8.py -k cuda -p no:cacheprovider > $R/fp8_test.log 2>&1; echo "fp8 cuda test rc=$? ${SECONDS}s"; tail -2 $R/fp8_test.log
echo "== profile"; SECONDS=0; timeout 285 python -m runtime.profiler.cli --out $R/h200-sxm.json --gpus 2 --budget 260 --force --no-progress > $R/profile.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -vi warn $R/profile.log | tail -11
P=$R/h200-sxm.json; [ -f $P ] || P=profiles/h200-sxm.json
echo "== accuracy"; SECONDS=0; timeout 70 python benchmarks/profile_accuracy.py --profile $P --out $R/acc --gemm-shapes 150 > $R/acc.log 2>&1; echo "rc=$? ${SECONDS}s"; grep -E "^(gemm|fp8|attention|collectives|layer):" $R/acc.log | cut -c1-200
SECONDS=0; OUT=$R/c2 PROFILE=$P timeout 95 bash benchmarks/validation/2gpu/run.sh > $R/c2.out 2>&1; echo "2gpu rc=$? ${SECONDS}s"
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 OUT=$R/c1 PROFILE=$P timeout 60 bash benchmarks/validation/1gpu/run.sh > $R/c1.out 2>&1; echo "1gpu rc=$? ${SECONDS}s"
wc -l $R/*/validation.csv
cd $OUT && tar czf k5.tgz k5 && rm -rf k5
