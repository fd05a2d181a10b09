"""The MoE experts' weight gradient, two ways, at the EP bar's shapes (8 experts, 16384 routed rows): torch's
grouped GEMM (bf16 out) + the add into fp32 main_grad, against runtime/grouped_wgrad.py (accumulating itself)."""
import json, sys
import torch
sys.path.insert(0, ".")
from runtime import grouped_wgrad as gw
from runtime.profiler.timing import time_fn
dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
counts = torch.multinomial(torch.ones(8), 16384, replacement=True, generator=g).bincount(minlength=8)
offs = counts.cumsum(0).to(torch.int32).to(dev)
out = []
for n, k in ((5632, 2048), (2048, 2816)):
    dy = torch.randn(16384, n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(16384, k, device=dev, dtype=torch.bfloat16)
    mg = torch.zeros(8, n, k, device=dev, dtype=torch.float32)
    def torch_way(i):
        mg.add_(torch._grouped_mm(dy.t(), x, offs=offs))
    def ours(i):
        gw.grouped_wgrad_(mg, dy, x, offs, overwrite=False)
    ours(0)
    best = gw._grouped_wgrad_tuned.best_config
    t0 = time_fn(torch_way, dev, warmup=3, repeats=15).median_s
    t1 = time_fn(ours, dev, warmup=3, repeats=15).median_s
    gemm_only = time_fn(lambda i: torch._grouped_mm(dy.t(), x, offs=offs), dev, warmup=3, repeats=15).median_s
    flops = 2 * 16384 * n * k
    r = dict(n=n, k=k, torch_grouped_plus_add_s=t0, torch_grouped_gemm_only_s=gemm_only, ours_s=t1,
             ours_tflops=flops / t1 / 1e12, torch_gemm_tflops=flops / gemm_only / 1e12, best_config=str(best))
    print(json.dumps(r)); out.append(r)
