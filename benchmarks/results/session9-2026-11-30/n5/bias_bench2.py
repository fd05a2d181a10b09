"""Session 9: runtime/bias_grad.py's Triton column sums against torch's sum(0), bf16, CUDA events, median of 20."""
import json
import torch
from runtime.bias_grad import bias_grad

out = []
for rows, cols in [(8192, 2048), (8192, 6144), (8192, 8192), (4096, 1024), (16384, 4096)]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    err = (bias_grad(x).float() - x.float().sum(0)).abs().max().item()
    res = {"rows": rows, "cols": cols, "max_abs_diff_vs_fp32_sum": err}
    for name, fn in (("triton", lambda: bias_grad(x)), ("torch_sum0", lambda: x.sum(0))):
        for _ in range(5):
            fn()
        ts = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
        ts.sort()
        res[name + "_us"] = round(ts[len(ts) // 2], 2)
    res["triton_GBps"] = round(rows * cols * 2 / res["triton_us"] / 1e3, 1)
    out.append(res)
    print(json.dumps(res), flush=True)
