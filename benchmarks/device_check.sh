#!/usr/bin/env bash
# What the lent one-GPU device machine measures for this repository, in one call, each part writing under $OUT:
#
#   PLAN_COMMIT=<commit> bash benchmarks/device_check.sh env cuda-tests validation:one-gpu trace:benchmarks/validation/one-gpu/plans/09-gpt2l-s1024-mb4-none.json
#
# env          the GPU, driver, CUDA, torch and NCCL versions -> $OUT/env.json
# cuda-tests   the test files that run on CUDA (Triton's CPU-interpreter cases are left to CI) -> $OUT/cuda-tests.xml (JUnit), .log
# validation:SET  benchmarks/validation/SET/run.sh (plan validate of every plan of the set) -> $OUT/validation.csv, .plans.jsonl, .log
# attention-backends  cuDNN against flash (FA2) attention at the power cap -> $OUT/attention-backends/ (benchmarks/attention_backends.py)
# fp8-grouped-gemm  FP8 and bf16 grouped GEMMs against dense ones at the power cap -> $OUT/fp8-grouped-gemm/ (benchmarks/fp8_grouped_gemm.py)
# trace:PLAN   a training run of PLAN with step 6 under torch.profiler -> $OUT/trace-<name>.txt (kernel tables)
#
# Wheels carried in .whl/ (OR-Tools and what it needs beyond the device's image) are installed first when present.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
OUT="${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
for part in "$@"; do
    SECONDS=0
    case "$part" in
    env)
        python3 - "$OUT/env.json" <<'PY'
import json, subprocess, sys, datetime, os
import torch
q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit", "--format=csv,noheader"],
                   capture_output=True, text=True).stdout.strip()
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("PLAN_COMMIT", "unknown"), "nvidia_smi": q, "torch": torch.__version__,
           "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
           "gpu": torch.cuda.get_device_name(0)}, open(sys.argv[1], "w"), indent=2)
PY
        ;;
    cuda-tests)
        timeout 400 python3 -m pytest -p no:cacheprovider -o addopts= -q -rfE -k "not interpreted" \
            --junitxml="$OUT/cuda-tests.xml" \
            tests/runtime/test_graph.py tests/runtime/test_rotary.py tests/runtime/test_norm.py \
            tests/runtime/test_bias_gelu.py tests/runtime/test_swiglu.py tests/runtime/test_geglu.py tests/runtime/parallel/test_optimizer.py \
            tests/runtime/test_model.py tests/runtime/test_qk_norm.py tests/runtime/test_moe_rows.py \
            tests/runtime/test_grouped_wgrad.py tests/runtime/parallel/test_fp8.py \
            tests/runtime/profiler/test_power_cap.py tests/runtime/profiler/test_host_probe.py > "$OUT/cuda-tests.log" 2>&1
        echo "cuda-tests rc=$? ${SECONDS}s: $(tail -1 "$OUT/cuda-tests.log")"
        ;;
    validation:*)
        set_name="${part#validation:}"
        OUT="$OUT" STEPS="${STEPS:-10}" WARMUP="${WARMUP:-4}" PYTHON=python3 bash "benchmarks/validation/$set_name/run.sh" > "$OUT/validation-run.txt" 2>&1
        echo "validation $set_name ${SECONDS}s: $(grep -c . "$OUT/validation.csv" 2>/dev/null) lines"
        ;;
    attention-backends)
        timeout 300 python3 benchmarks/attention_backends.py --out "$OUT/attention-backends" --at-power-cap \
            > "$OUT/attention-backends.log" 2>&1
        echo "attention-backends rc=$? ${SECONDS}s"
        ;;
    fp8-grouped-gemm)
        timeout 300 python3 benchmarks/fp8_grouped_gemm.py --out "$OUT/fp8-grouped-gemm" --at-power-cap \
            > "$OUT/fp8-grouped-gemm.log" 2>&1
        echo "fp8-grouped-gemm rc=$? ${SECONDS}s"
        ;;
    trace:*)
        plan="${part#trace:}"; name="$(basename "$plan" .json)"
        timeout 120 python3 -m torch.distributed.run --nproc-per-node 1 -m runtime.train --plan "$plan" --steps 8 \
            --device cuda --trace-step 6 --trace-out "$OUT/trace-$name.txt" > "$OUT/trace-$name.log" 2>&1
        echo "trace $name rc=$? ${SECONDS}s"
        ;;
    *) echo "unknown part '$part'" >&2; exit 1 ;;
    esac
done
