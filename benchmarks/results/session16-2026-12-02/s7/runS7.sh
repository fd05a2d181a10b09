#!/bin/bash
# session 16, call s7 (one GPU): attention at head dimensions 192 and 256 over the profiler's whole sequence grid
# (512-131072, causal and not; benchmarks/attention_head_dims.py: kernels.time_attention on shapes.attention_grid's
# rows), in bursts (as the default profile's tables) and at the power cap (as h200-sxm.json's), to add to the
# shipped profiles (Gemma's head dimension is 256; the profiles had 64 and 128 only).
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/s7; mkdir -p $R; date -u > $R/date.txt; cp runS7.sh commit $R/; nvidia-smi -L > $R/gpu.txt
S=512,1024,2048,4096,8192,16384,32768,65536,131072
SECONDS=0; timeout 130 python benchmarks/attention_head_dims.py --out $R/burst --head-dims 192,256 --seqs $S > $R/burst.log 2>&1; echo "burst rc=$? ${SECONDS}s"; tail -4 $R/burst.log
SECONDS=0; timeout 150 python benchmarks/attention_head_dims.py --out $R/cap --head-dims 192,256 --seqs $S --at-power-cap > $R/cap.log 2>&1; echo "cap rc=$? ${SECONDS}s"; tail -4 $R/cap.log
cd $OUT && tar czf s7.tgz s7 && rm -rf s7
