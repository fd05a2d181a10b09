#!/bin/bash
# session 9, call 3 (2x H200): (a) GPT-1.3B on one GPU replayed, without and with --compile (torch.compile of each
# layer), then the torch.compile and Megatron-Core anchors in the same call; (b) the memory leak between plans:
# six quality plans back to back, the TP2 one last (n2 measured it alone: 12.85 GiB)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/n3; mkdir -p $R; date -u > $R/date.txt; cp gpu/runN3.sh gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
python gpu/mkgraph.py $R/plans > /dev/null
for v in plain compile; do
  extra=""; [ $v = compile ] && extra="--compile"
  SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 150 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-graph.json --steps 16 --device cuda --results $R/gpt13-$v.csv $extra > $R/gpt13-$v.log 2>&1; echo "$v rc=$? ${SECONDS}s"
  tail -n 10 $R/gpt13-$v.csv | cut -d, -f1-6 | tr '\n' ' '; echo
done
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl 2>&1 | tail -1
(cd anchors; CUDA_VISIBLE_DEVICES=0 timeout 100 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile) > $R/anchors.jsonl 2>$R/anchors.err; echo "compile anchor rc=$?"
(cd anchors; CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD/../.site timeout 100 python -m torch.distributed.run --nproc-per-node 1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4) >> $R/anchors.jsonl 2>>$R/anchors.err; echo "mcore anchor rc=$?"
cut -c1-220 $R/anchors.jsonl
Q=benchmarks/validation/quality/plans
SECONDS=0; timeout 150 python -m runtime.validate $Q/q-gpt-1.3b-r0[2-6]-*.json $Q/q-gpt-1.3b-r42-*.json --steps 5 --warmup 3 --append $R/leak.csv > $R/leak.log 2>&1; echo "leak rc=$? ${SECONDS}s"
grep -E "^---|peak memory" $R/leak.log | sed 's/.*plans.//'
cd $OUT && tar czf n3.tgz n3 && rm -rf n3
