"""CUDA check of the runtime's Triton cross-entropy and norms against the PyTorch paths, at GPT-1.3B size."""
import torch
import torch.nn.functional as F
from runtime.norm import norm
from runtime.parallel.cross_entropy import vocab_parallel_cross_entropy as ce


def timed(fn, n=10):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record(); fn(); e.record()
        torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2]


torch.manual_seed(0)
N, V, H = 8192, 50304, 2048
x0 = torch.randn(N, V, device="cuda", dtype=torch.bfloat16) * 2
t = torch.randint(0, V, (N,), device="cuda"); t[::97] = -100
res = {}
for fused in (False, True):
    def run():
        x = x0.clone().requires_grad_()
        l = ce(x, t, None, -100, fused=fused); l.sum().backward(); return l, x.grad
    l, g = run(); res[fused] = (l.detach(), g.float())
    clone_ms = timed(lambda: x0.clone())
    print(f"cross-entropy fused={fused}: fwd+bwd {timed(run) - clone_ms:.3f} ms ({N}x{V} bf16)")
print("cross-entropy max |loss diff|", (res[True][0] - res[False][0]).abs().max().item(),
      "max |grad diff|", (res[True][1] - res[False][1]).abs().max().item())
for rms in (False, True):
    x = torch.randn(N, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = None if rms else torch.randn(H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(N, H, device="cuda", dtype=torch.bfloat16)
    out = {}
    params = [p for p in (x, w, b) if p is not None]
    for fused in (False, True):
        def run():
            for p in params:
                p.grad = None
            y = norm(x, w, b, 1e-5, rms, fused=fused); y.backward(dy); return y
        y = run()
        out[fused] = [y.float()] + [p.grad.float().clone() for p in params]
        print(f"{'rmsnorm' if rms else 'layernorm'} fused={fused}: fwd+bwd {timed(run):.3f} ms ([{N},{H}] bf16)")
    print("  max |diff| y, dx, dw(, db):", [round((a - c).abs().max().item(), 4) for a, c in zip(out[True], out[False])],
          "max |ref|:", [round(c.abs().max().item(), 2) for c in out[False]])
