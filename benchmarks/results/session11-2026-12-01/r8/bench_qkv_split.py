"""Session 11: the qkv split's backward (runtime/qkv_split.py) against autograd's concatenation plus the bias sum,
at GPT-1.3B's shape (seq 2048, micro-batch 4, 16 heads of 128), head gradients laid out as the cuDNN attention
backward returns them (taken from a real SDPA backward). CUDA events, median of 30 after 5."""
import json
import statistics

import torch
import torch.nn.functional as F

from runtime import qkv_split as qs

dev = torch.device("cuda")
s, b, h, d = 2048, 4, 16, 128
qkv = torch.randn(s, b, 3 * h * d, device=dev, dtype=torch.bfloat16, requires_grad=True)
bias = torch.nn.Parameter(torch.zeros(3 * h * d, device=dev, dtype=torch.bfloat16))
q, k, v = qs.split_heads(qkv, h, h, d)
o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
print("strides", dq.stride(), dk.stride(), dv.stride(), flush=True)


def timed(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); e.record(); e.synchronize()
        ts.append(a.elapsed_time(e) * 1e3)
    return statistics.median(ts)


x = qkv.detach().requires_grad_(True)
plain = qs.split_heads(x, h, h, d)
fused_in = qkv.detach().requires_grad_(True)
fused = qs.split_heads_with_bias_grad(fused_in, bias, h, h, d)
t_plain = timed(lambda: torch.autograd.grad(plain, x, (dq, dk, dv), retain_graph=True)[0].sum((0, 1)))
t_fused = timed(lambda: torch.autograd.grad(fused, (fused_in, bias), (dq, dk, dv), retain_graph=True))
print(json.dumps({"concat_plus_bias_sum_us": round(t_plain, 1), "fused_us": round(t_fused, 1)}), flush=True)
