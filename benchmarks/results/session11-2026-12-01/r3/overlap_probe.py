"""Session 11: does the AdamW step (memory-bound) overlap with forward GEMMs (compute-bound) on one H200 at its
power cap? Times, for 3 s each: GEMMs alone, AdamW alone (runtime/parallel/adamw.py's kernel over 1.31 B fp32
parameters with bf16 weights, GPT-1.3B's size), and both at once on two streams; prints each one's rate and
the GPU's power in each phase (nvidia-smi every 100 ms, run by the caller)."""
import json
import sys
import time

import torch

from runtime.parallel.adamw import Segment, adamw_

dev = torch.device("cuda")
N = 1_311_000_000
chunk = 40_000_000   # the optimizer's bucket size
master = torch.randn(N, device=dev) * 0.02
grad = torch.randn(N, device=dev, dtype=torch.float32) * 1e-3
m, v = torch.zeros(N, device=dev), torch.zeros(N, device=dev)
param = master.to(torch.bfloat16)
segs = [Segment(master[a:a + chunk], grad[a:a + chunk], m[a:a + chunk], v[a:a + chunk], param[a:a + chunk], True)
        for a in range(0, N, chunk)]
scalars = torch.empty(4, device=dev)
A = torch.randn(8192, 2048, device=dev, dtype=torch.bfloat16)
B = torch.randn(8192, 2048, device=dev, dtype=torch.bfloat16)   # fc1 of GPT-1.3B at micro-batch 4: [8192, 2048] x [2048, 8192]
C = torch.empty(8192, 8192, device=dev, dtype=torch.bfloat16)
s_gemm, s_adam = torch.cuda.Stream(), torch.cuda.Stream()


def gemms(n):
    with torch.cuda.stream(s_gemm):
        for _ in range(n):
            torch.mm(A, B.t(), out=C)


def adam(n):
    with torch.cuda.stream(s_adam):
        for i in range(n):
            adamw_(segs, i + 1, 3e-4, (0.9, 0.95), 1e-8, 0.1, scalars=scalars)


def phase(name, g, a, seconds=3.0):
    torch.cuda.synchronize()
    t0 = time.time()
    marks = [time.strftime("%H:%M:%S", time.gmtime(t0))]
    ng = na = 0
    e0 = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    e1 = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    e0[0].record(s_gemm); e0[1].record(s_adam)
    while time.time() - t0 < seconds:
        if g:
            gemms(20); ng += 20
        if a:
            adam(1); na += 1
        torch.cuda.synchronize()
    e1[0].record(s_gemm); e1[1].record(s_adam)
    torch.cuda.synchronize()
    wall = time.time() - t0
    out = {"phase": name, "utc_start": marks[0], "wall_s": round(wall, 3), "gemms": ng, "adamw_steps": na,
           "gemm_ms_each": round(wall * 1e3 / ng, 4) if ng else None,
           "gemm_tflops": round(2 * 8192 * 8192 * 2048 * ng / wall / 1e12, 1) if ng else None,
           "adamw_ms_each": round(wall * 1e3 / na, 3) if na else None}
    print(json.dumps(out), flush=True)
    return out


gemms(50); adam(2); torch.cuda.synchronize()
phase("warm", True, False, 2.0)
res = [phase("gemm", True, False), phase("adamw", False, True), phase("both", True, True),
       phase("gemm", True, False), phase("both", True, True)]
json.dump(res, open(sys.argv[1], "w"), indent=1)
