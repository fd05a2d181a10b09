#!/bin/bash
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi topo -m > $OUT/topo.txt 2>&1
python -c "import torch;print(torch.__version__, torch.cuda.device_count(), torch.version.cuda)"
echo "== gpt13 tp1"; timeout 120 python -m runtime.launch gpu/gpt13-tp1.json --device cuda --steps 10 --results $OUT/gpt13-tp1.csv > $OUT/gpt13-tp1.log 2>&1; tail -6 $OUT/gpt13-tp1.log
echo "== gpt67 tp2"; timeout 150 python -m runtime.launch gpu/gpt67-tp2.json --device cuda --steps 8 --results $OUT/gpt67-tp2.csv > $OUT/gpt67-tp2.log 2>&1; tail -6 $OUT/gpt67-tp2.log
echo "== gpt13 dp2"; timeout 100 python -m runtime.launch gpu/gpt13-dp2.json --device cuda --steps 8 --results $OUT/gpt13-dp2.csv > $OUT/gpt13-dp2.log 2>&1; tail -4 $OUT/gpt13-dp2.log
echo "== cuda tests"; timeout 60 python -m pytest -q -x tests/parallel/test_context.py -k cuda 2>&1 | tail -4
echo "== profiler"; timeout 290 python -m runtime.profiler.cli --out $OUT/h200-sxm.json --gpus 2 --force > $OUT/profile.log 2>&1; tail -8 $OUT/profile.log
ls -la $OUT
