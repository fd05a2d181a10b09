"""Session 10: the bias-gradient column sum three ways (torch sum(0), a GEMV against ones, a [1, T] x [T, N]
GEMM), and runtime/norm.py's fused residual norm against PyTorch's add + norm, bf16, CUDA events, median of 20."""
import json
import torch
import torch.nn.functional as F
from runtime.norm import residual_norm


def med_us(fn):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return round(ts[len(ts) // 2], 2)


for rows, cols in [(8192, 2048), (8192, 6144), (8192, 8192), (4096, 1024), (16384, 4096)]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    ones_row = torch.ones(1, rows, device="cuda", dtype=torch.bfloat16)
    ones_col = torch.ones(rows, device="cuda", dtype=torch.bfloat16)
    ref = x.float().sum(0)
    res = {"kind": "bias_grad", "rows": rows, "cols": cols}
    for name, fn in (("sum0", lambda: x.sum(0)), ("gemm", lambda: (ones_row @ x)[0]), ("gemv", lambda: torch.mv(x.t(), ones_col))):
        res[name + "_us"] = med_us(fn)
        res[name + "_maxerr"] = (fn().float() - ref).abs().max().item()
    print(json.dumps(res), flush=True)

for rows, n, rms in [(8192, 2048, False), (8192, 4096, False), (8192, 2048, True), (16384, 4096, True)]:
    x, d, gy, gs = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = None if rms else torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    def torch_path():
        xs = x.detach().requires_grad_(True)
        s = xs + d
        y = F.rms_norm(s, (n,), w) if rms else F.layer_norm(s, (n,), w, b)
        torch.autograd.backward([y, s], [gy, gs])
    def fused_path():
        xs = x.detach().requires_grad_(True)
        s, y = residual_norm(xs, d, w, b, 1e-5, rms)
        torch.autograd.backward([y, s], [gy, gs])
    res = {"kind": "residual_norm_fwd_bwd", "rows": rows, "hidden": n, "rms": rms,
           "torch_us": med_us(torch_path), "fused_us": med_us(fused_path)}
    print(json.dumps(res), flush=True)
