#!/bin/bash
# session 18, call c1 (one GPU), after the learning-rate schedule and optimizer options: the runtime's CUDA test files
# (Triton-interpreter tests left to CI); `plan launch` of GPT-1.3B (bf16 main gradients, CUDA graph) for 30 steps
# with a cosine schedule (warm-up 5, decay to 3e-5 at step 30) and with the default options, the step CSVs' lr and
# tokens/s compared.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/c1; mkdir -p $R; date -u > $R/date.txt; cp runC.sh commit $R/; nvidia-smi -L > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,nounits -lms 100 > $R/clocks.csv 2>&1 & SMI=$!
SECONDS=0; timeout 260 python -m pytest -p no:cacheprovider -o addopts= -q -rfE -k "not interpreted" tests/runtime/test_graph.py tests/runtime/test_rotary.py tests/runtime/test_norm.py tests/runtime/test_bias_gelu.py tests/runtime/test_swiglu.py tests/runtime/test_optimizer.py tests/runtime/test_model.py tests/runtime/test_qk_norm.py tests/runtime/test_moe_rows.py tests/runtime/test_grouped_wgrad.py > $R/cuda-tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $R/cuda-tests.log; grep -E "^(FAILED|ERROR)" $R/cuda-tests.log | cut -c1-200 | head
SECONDS=0; timeout 100 python -m planner.cli launch plans/gpt13-tp1-bf16.json --steps 30 --lr 3e-4 --min-lr 3e-5 --lr-warmup-steps 5 --lr-decay-style cosine --lr-decay-steps 30 --results $R/launch-cosine.csv > $R/launch-cosine.log 2>&1; echo "launch cosine rc=$? ${SECONDS}s"
SECONDS=0; timeout 100 python -m planner.cli launch plans/gpt13-tp1-bf16.json --steps 30 --results $R/launch-default.csv > $R/launch-default.log 2>&1; echo "launch default rc=$? ${SECONDS}s"
kill $SMI
for f in cosine default; do python - $R/launch-$f.csv $f <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
steady = [float(r["step_s"]) for r in rows[4:]]
print(sys.argv[2], "lr:", " ".join(f"{float(r['lr']):.3g}" for r in rows[::3]), "| loss first/last", rows[0]["loss"], rows[-1]["loss"],
      f"| median step {statistics.median(steady):.5f} s = {4 * 2048 / statistics.median(steady):.0f} tok/s")
PY
done
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
