#!/bin/bash
# session 16, call s5 (one GPU): after the fused rotary learned half head dimensions that are not powers of two:
# its CUDA tests; the three phi3-mini plans and one qwen2-7b-8l plan of s2 validated again; a traced phi3 step.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/s5; mkdir -p $R/val; date -u > $R/date.txt; cp runS5.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 150 python -m pytest -q -x tests/runtime/test_rotary.py > $R/tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -3 $R/tests.log
P=benchmarks/validation/hf-s16/plans
SECONDS=0; timeout 200 python -m runtime.validate $P/01-phi3-mb1-none.json $P/02-phi3-mb2-sel.json $P/03-phi3-mb4-full.json $P/04-qwen2-8l-mb1-none.json --steps 12 --warmup 6 --device cuda --timeout 190 --append $R/val/validation.csv > $R/val/validation.log 2>&1; echo "validate rc=$? ${SECONDS}s"
kill $SMI
cut -d, -f1,9,11-16 $R/val/validation.csv
SECONDS=0; timeout 60 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $P/01-phi3-mb1-none.json --steps 8 --device cuda --trace-step 7 --trace-out $R/trace-01-phi3-mb1-none.txt > $R/train.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-01-phi3-mb1-none.txt
cd $OUT && tar czf s5.tgz s5 && rm -rf s5
