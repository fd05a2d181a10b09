"""runtime/qk_norm.py: Qwen3's per-head q/k RMSNorm in the qkv layout against autograd through PyTorch's own
per-head RMSNorm (output and the gradients of qkv and both weights, also into fp32 main_grad views), under
Triton's interpreter (a worker process with TRITON_INTERPRET=1) and on CUDA."""

import pytest
import torch
import torch.nn.functional as F

from runtime import qk_norm as qn
from tests.runtime.dist_util import run_interpreted


def _reference(qkv, wq, wk, heads, kv_heads, eps):
    """The plain per-head RMSNorm of q and k, v unchanged (what runtime/model.py runs without Triton)."""
    d = wq.numel()
    s, b, _ = qkv.shape
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = F.rms_norm(q.reshape(s, b, heads, d), (d,), wq, eps)
    k = F.rms_norm(k.reshape(s, b, kv_heads, d), (d,), wk, eps)
    return torch.cat([q.flatten(2), k.flatten(2), v], dim=-1)


def _check(device, dtype, s=7, b=3, heads=4, kv_heads=2, d=24, main_grad=False) -> list[str]:
    torch.manual_seed(0)
    eps = 1e-6
    qkv = torch.randn(s, b, (heads + 2 * kv_heads) * d)
    wq, wk = 1 + 0.2 * torch.randn(d), 1 + 0.2 * torch.randn(d)
    gy = torch.randn(s, b, (heads + 2 * kv_heads) * d)
    ref = [t.double().requires_grad_(True) for t in (qkv, wq, wk)]
    want = _reference(*ref, heads, kv_heads, eps)
    (want * gy.double()).sum().backward()

    x = qkv.to(dtype).to(device).requires_grad_(True)
    pq, pk = (torch.nn.Parameter(w.to(dtype).to(device)) for w in (wq, wk))
    uses = 2 if main_grad else 1
    if main_grad:  # as the optimizer gives them: stale views in one flat buffer, overwritten on first use
        flat = torch.full((3 * d,), float("nan"), device=device)
        pq.main_grad, pk.main_grad = flat[2 * d:], flat[:d]
        pq.main_grad_fresh = pk.main_grad_fresh = True
    bad = []
    assert qn.fused(x)
    for _ in range(uses):
        y = qn.qk_norm(x, pq, pk, heads, kv_heads, eps)
        (y.float() * gy.to(device)).sum().backward()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    got_wq = pq.main_grad / uses if main_grad else pq.grad
    got_wk = pk.main_grad / uses if main_grad else pk.grad
    for name, got, exp in (("y", y, want), ("grad qkv", x.grad / uses, ref[0].grad), ("grad q_norm", got_wq, ref[1].grad),
                           ("grad k_norm", got_wk, ref[2].grad)):
        err = (got.detach().cpu().double() - exp.detach()).abs().max().item() / max(1.0, exp.abs().max().item())
        if err > tol:
            bad.append(f"{name} ({dtype}, d={d}, main_grad={main_grad}): relative error {err:.3g}")
    if main_grad and not (pq.grad_in_main_grad and pk.grad_in_main_grad):
        bad.append("the hooks were not told the gradients are in main_grad")
    return bad


def _interpreted(rank, world):
    # head_dim not a power of two, rows that do not fill the last block; head_dim 128 as Qwen3 has it
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, s=5, b=1, heads=2, kv_heads=1, d=128) \
        + _check("cpu", torch.float32, main_grad=True)


def test_qk_norm_matches_per_head_rms_norm_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_matches_per_head_rms_norm_on_cuda(dtype):
    assert _check("cuda", dtype) + _check("cuda", dtype, s=512, b=2, heads=32, kv_heads=8, d=128) \
        + _check("cuda", dtype, main_grad=True) == []
