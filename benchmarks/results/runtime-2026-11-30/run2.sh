#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export MCPATH=/tmp/site
L() { timeout $1 python -m runtime.launch gpu/$2.json --device cuda --steps $3 --results $OUT/$2$4.csv ${@:5} > $OUT/$2$4.log 2>&1; echo "== $2$4 rc=$?"; tail -2 $OUT/$2$4.log; }
L 200 gpt13-tp1 12 -compile --compile
L 90 gpt13-tp1 12 -eager
(cd anchors; timeout 60 python gpt_step_anchor.py torch 24 2048 16 2048 4; timeout 150 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile; PYTHONPATH=$MCPATH timeout 100 torchrun --nproc_per_node=1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4 2>&1 | grep anchor) | tee $OUT/anchors.jsonl
L 120 gpt67-tp1 8 -eager
L 120 gpt67-tp2 8 -eager
(cd anchors; PYTHONPATH=$MCPATH timeout 120 torchrun --nproc_per_node=2 gpt_step_anchor.py mcore 2 32 4096 32 2048 2 2>&1 | grep anchor) | tee -a $OUT/anchors.jsonl
echo "== accuracy"; timeout 200 python benchmarks/profile_accuracy.py --profile profiles/h200-sxm.json --out $OUT/acc > $OUT/acc.log 2>&1; tail -25 $OUT/acc.log
