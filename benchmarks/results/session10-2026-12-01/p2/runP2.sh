#!/bin/bash
# session 10, call 2: the norm kernels at full occupancy, norm weights / biases / embedding gradients straight into main_grad: CUDA tests, kernel checks,
# GPT-1.3B on one GPU replayed (and traced), with the torch.compile and Megatron-Core anchors in the same call
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat gpu/commit) PYTHONPATH=$PWD
R=$OUT/p2; mkdir -p $R; date -u > $R/date.txt; cp gpu/runP2.sh gpu/bench_p1.py gpu/elem_part.py gpu/commit $R/; nvidia-smi -L > $R/gpu.txt
SECONDS=0; timeout 200 python -m pytest -q -x tests/runtime/test_norm.py tests/runtime/test_swiglu.py tests/runtime/test_graph.py -k "cuda or beside or 1-1-1-none-False or 1-1-1-optimizer-False" > $R/pytest.log 2>&1; echo "pytest rc=$? ${SECONDS}s"; tail -2 $R/pytest.log; grep -E "^E " $R/pytest.log | head -5
CUDA_VISIBLE_DEVICES=0 timeout 60 python gpu/bench_p1.py > $R/bench.jsonl 2>&1; cut -c1-220 $R/bench.jsonl
CUDA_VISIBLE_DEVICES=0 timeout 90 python gpu/elem_part.py $R/elementwise-part.json > $R/elem.log 2>&1; echo "elem rc=$?"; cat $R/elem.log | tail -16
python gpu/mkgraph.py $R/plans > /dev/null
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 250 > $R/clocks.csv 2>&1 & SMI=$!
date -u +%T.%N > $R/gpt13_start.txt; SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 120 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-graph.json --steps 40 --device cuda --results $R/gpt13.csv > $R/gpt13.log 2>&1; echo "gpt13 rc=$? ${SECONDS}s"; tail -3 $R/gpt13.log | cut -c1-200
SECONDS=0; CUDA_VISIBLE_DEVICES=0 timeout 60 python -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan $R/plans/gpt13-tp1-graph.json --steps 7 --device cuda --trace-step 6 --trace-out $R/trace-gpt13-tp1-graph.txt > $R/trace.log 2>&1; echo "trace rc=$? ${SECONDS}s"; grep "GPU timeline" $R/trace-gpt13-tp1-graph.txt
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl 2>&1 | tail -1
date -u +%T.%N > $R/anchor_compile_start.txt; (cd anchors; CUDA_VISIBLE_DEVICES=0 timeout 100 python gpt_step_anchor.py torch 24 2048 16 2048 4 compile) > $R/anchors.jsonl 2>$R/anchors.err; echo "compile anchor rc=$?"
(cd anchors; CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD/../.site timeout 100 python -m torch.distributed.run --nproc-per-node 1 gpt_step_anchor.py mcore 1 24 2048 16 2048 4) >> $R/anchors.jsonl 2>>$R/anchors.err; echo "mcore anchor rc=$?"
kill $SMI; cut -c1-200 $R/anchors.jsonl
python - $R/gpt13.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if int(r["step"]) > 4]
s16 = statistics.median(float(r["step_s"]) for r in rows if int(r["step"]) <= 16); print(f"gpt13 median of steps 5-16 {s16:.5f} s, {4 * 2048 / s16:.0f} tok/s")
s = statistics.median(float(r["step_s"]) for r in rows); print(f"gpt13 median step {s:.5f} s, {4 * 2048 / s:.0f} tok/s over {len(rows)} steps")
PY
NG=$(nvidia-smi -L | wc -l); [ "$NG" -ge 2 ] && { mkdir -p $R/fsdp; SECONDS=0; timeout 150 python -m runtime.validate gpu/fsdp/gpt-dp2-full-mb4.json gpu/fsdp/gpt-dp2-full-mb1.json gpu/fsdp/llama-dp2-full-mb4.json gpu/fsdp/llama-dp2-full-mb1.json --steps 6 --warmup 3 --timeout 40 --append $R/fsdp/validation.csv > $R/fsdp/validation.log 2>&1; echo "fsdp validate rc=$? ${SECONDS}s"; cut -d, -f1-9,13-16 $R/fsdp/validation.csv; }
SECONDS=0; CUDA_VISIBLE_DEVICES=0 NGPUS=1 STEPS=6 WARMUP=3 OUT=$R/v1 bash benchmarks/validation/1gpu/run.sh > $R/v1.out 2>&1; echo "1gpu set rc=$? ${SECONDS}s"; wc -l < $R/v1/validation.csv
head -34 $R/trace-gpt13-tp1-graph.txt | cut -c1-100,170-200
cd $OUT && tar czf p2.tgz p2 && rm -rf p2
