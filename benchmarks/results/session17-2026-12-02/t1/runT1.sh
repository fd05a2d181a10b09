#!/bin/bash
# session 17, call t1 (one GPU): where an eager step's host time goes. For four eager one-GPU plans
# (session 15's r1 set): 12 steps under cProfile (host Python time), then a torch.profiler step with CPU ops.
cd gpu/new
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PLAN_COMMIT=$(cat commit) PYTHONPATH=$PWD
R=$OUT/t1; mkdir -p $R; date -u > $R/date.txt; cp runT1.sh commit $R/; nvidia-smi -L > $R/gpu.txt; nproc > $R/nproc.txt; lscpu > $R/lscpu.txt
export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533
P=benchmarks/validation/1gpu-s15/plans
for f in 01-gpt13-mb1-none-eager 11-bert-mb4-none-eager 05-llama1b-mb1-none-eager; do
  SECONDS=0; timeout 90 python -m runtime.train --plan $P/$f.json --steps 12 --device cuda > $R/plain-$f.log 2>&1; echo "$f plain rc=$? ${SECONDS}s"
  grep "^step 1[0-2]" $R/plain-$f.log | awk '{print $7, $8}'
  SECONDS=0; timeout 120 python -m cProfile -o $R/$f.pstats -m runtime.train --plan $P/$f.json --steps 12 --device cuda > $R/cprof-$f.log 2>&1; echo "$f cprofile rc=$? ${SECONDS}s"
  python -c "
import pstats,sys
p=pstats.Stats('$R/$f.pstats', stream=open('$R/cprof-$f.txt','w'))
p.sort_stats('tottime').print_stats(80); p.sort_stats('cumtime').print_stats(80); p.print_callers(40)"
  SECONDS=0; timeout 90 python -m runtime.train --plan $P/$f.json --steps 9 --device cuda --trace-step 8 --trace-out $R/trace-$f.txt > $R/trace-$f.log 2>&1; echo "$f trace rc=$? ${SECONDS}s"
done
cd $OUT && tar czf t1.tgz t1 && rm -rf t1
