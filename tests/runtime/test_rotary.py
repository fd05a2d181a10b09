"""runtime/rotary.py: the qkv split with rotary on q and k, and its backward, against autograd through
runtime/attention.py's apply_rotary in float64: on the PyTorch path, under Triton's interpreter (a worker process
with TRITON_INTERPRET=1) and on CUDA."""

import pytest
import torch

from runtime.attention import apply_rotary, rotary_tables
from runtime.rotary import qkv_rotary
from tests.runtime.dist_util import run_interpreted


def _reference(qkv, cos, sin, heads, kv_heads):
    s, b, w = qkv.shape
    d = w // (heads + 2 * kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = q.reshape(s, b, heads, d).permute(1, 2, 0, 3)
    k = k.reshape(s, b, kv_heads, d).permute(1, 2, 0, 3)
    v = v.reshape(s, b, kv_heads, d).permute(1, 2, 0, 3)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def _check(device: str, dtype, s=7, b=3, heads=4, kv_heads=2, d=16) -> list[str]:
    torch.manual_seed(0)
    qkv = torch.randn(s, b, (heads + 2 * kv_heads) * d).to(dtype)
    cos, sin = rotary_tables(torch.arange(5, 5 + s), d)   # positions not from 0: a CP or later-stage shard
    grads = [torch.randn(b, n, s, d).to(dtype) for n in (heads, kv_heads, kv_heads)]
    ref_in = qkv.double().requires_grad_(True)
    ref = _reference(ref_in, cos.double(), sin.double(), heads, kv_heads)
    torch.autograd.backward(ref, [g.double() for g in grads])
    dev = torch.device(device)
    x = qkv.to(dev).requires_grad_(True)
    out = qkv_rotary(x, cos.to(dev), sin.to(dev), heads, kv_heads)
    torch.autograd.backward(out, [g.to(dev) for g in grads])
    from runtime.triton_support import use_triton
    fused = use_triton(dev)   # the fused kernel writes contiguous q, k, v (PyTorch's path keeps qkv's strides)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    bad = []
    for name, got, want in zip(("q", "k", "v"), out, ref):
        if got.shape != want.shape or got.dtype != dtype or (fused and not got.is_contiguous()):
            bad.append(f"{name}: {tuple(got.shape)} {got.dtype} contiguous={got.is_contiguous()}")
        elif not torch.allclose(got.cpu().double(), want, rtol=tol, atol=tol):
            bad.append(f"{name} {dtype}: max error {(got.cpu().double() - want).abs().max():.3g}")
    if not torch.allclose(x.grad.cpu().double(), ref_in.grad, rtol=tol, atol=tol):
        bad.append(f"dqkv {dtype}: max error {(x.grad.cpu().double() - ref_in.grad).abs().max():.3g}")
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_path_matches_apply_rotary(dtype):
    assert _check("cpu", dtype) == []


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    # GQA with head counts that are not powers of two; multi-head attention (kv = heads); half head dimensions
    # that are not (Phi-3's 96: 48 here as 12 and 6)
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, s=5, b=2, heads=3, kv_heads=3, d=8) \
        + _check("cpu", torch.float32, s=4, b=1, heads=6, kv_heads=1, d=32) \
        + _check("cpu", torch.float32, s=3, b=2, heads=4, kv_heads=2, d=24) \
        + _check("cpu", torch.float32, s=3, b=1, heads=2, kv_heads=1, d=12)


def test_triton_rotary_matches_apply_rotary_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_rotary_matches_apply_rotary_on_cuda(dtype):
    assert _check("cuda", dtype) == [] and _check("cuda", dtype, s=2048, b=2, heads=16, kv_heads=4, d=128) == []
    assert _check("cuda", dtype, s=1024, b=2, heads=32, kv_heads=32, d=96) == []   # Phi-3: half of 96 is 48


def _llama_step(fused: bool, mode: str, monkeypatch, device: str):
    """One training step of a tiny Llama-style model (GQA) with the fused rotary or PyTorch's, fp32."""
    import runtime.rotary as rot
    from tests.runtime.test_norm import _model_step
    monkeypatch.setattr(rot, "use_triton", rot.use_triton if fused else (lambda dev: False))
    from planner.model import tiny_model
    return _model_step("llama", [mode] * tiny_model("llama").num_layers, True, monkeypatch, device=device)


def _same_training(device, monkeypatch) -> list[str]:
    bad = []
    for mode in ("none", "selective", "full"):
        loss_f, grads_f = _llama_step(True, mode, monkeypatch, device)
        loss_p, grads_p = _llama_step(False, mode, monkeypatch, device)
        if abs(loss_f - loss_p) > 1e-5 * abs(loss_p):
            bad.append(f"{mode}: loss {loss_f} against {loss_p}")
        for name, g in grads_p.items():
            if (grads_f[name] - g).abs().max().item() > 1e-4 * max(1e-6, g.abs().max().item()) + 1e-7:
                bad.append(f"{mode}: {name}")
    return bad


def _attention_layer(fused: bool, monkeypatch, device: str):
    """A tiny Llama attention block (GQA) forward and backward, fused rotary or PyTorch's: output, input gradient,
    qkv weight gradient."""
    import runtime.rotary as rot
    from planner.model import tiny_model
    from runtime.mesh import single_process_groups
    from runtime.model import Attention
    monkeypatch.setattr(rot, "use_triton", rot.use_triton if fused else (lambda dev: False))
    spec = tiny_model("llama")
    torch.manual_seed(0)
    attn = Attention(spec, single_process_groups(), overlap=False).to(device)
    for prm in attn.parameters():
        torch.nn.init.normal_(prm, std=0.05)
    s, b = 12, 3
    x = torch.randn(s, b, spec.hidden, device=device, requires_grad=True)
    cos, sin = rotary_tables(torch.arange(s, device=device), spec.head_dim)
    out = attn(x, (cos, sin), False)
    out.backward(torch.randn_like(out))
    return out.detach(), x.grad, attn.qkv.weight.grad


def _interpreted_attention(rank, world):
    import pytest as _pytest
    mp = _pytest.MonkeyPatch()
    fused, plain = _attention_layer(True, mp, "cpu"), _attention_layer(False, mp, "cpu")
    return [name for name, a, b in zip(("output", "input gradient", "qkv weight gradient"), fused, plain)
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6)]


def test_attention_with_fused_rotary_matches_the_plain_one_interpreted(monkeypatch):
    """model.Attention with the fused kernel (its head counts, qkv layout and tables as the model passes them)
    against PyTorch's rotary: output and gradients. Whole models train the same on CUDA (below)."""
    assert run_interpreted(_interpreted_attention, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_llama_trains_the_same_with_fused_and_plain_rotary_on_cuda(monkeypatch):
    assert _same_training("cuda", monkeypatch) == []
