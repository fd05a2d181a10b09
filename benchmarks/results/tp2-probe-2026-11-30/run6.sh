#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
R() { tag=$1; shift; p=$1; shift; env "$@" timeout 90 python -m torch.distributed.run --nproc-per-node=2 --standalone -m runtime.train --plan gpu/$p.json --steps 8 --device cuda --results /tmp/$tag.csv > $OUT/$tag.log 2>&1; echo "== $tag rc=$? $(grep '^step' $OUT/$tag.log | tail -3 | awk '{print $8}' | tr '\n' ' ')"; }
R tp2mb1-default tp2-mb1
R tp2mb1-simple tp2-mb1 NCCL_PROTO=Simple
R tp2mb1-nooverlap tp2-mb1-nooverlap
R gpt67tp2-default gpt67-tp2
R gpt67tp2-simple gpt67-tp2 NCCL_PROTO=Simple
(cd anchors; PYTHONPATH=/tmp/site timeout 100 torchrun --nproc_per_node=2 gpt_step_anchor.py mcore 2 32 4096 32 2048 2 2>&1 | grep anchor) | tee $OUT/anchor.jsonl
