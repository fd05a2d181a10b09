"""runtime/qkv_split.py: the head split's backward (the concatenation of the head gradients and the qkv bias's
gradient from the same pass) against autograd through the plain split, under Triton's interpreter (a worker
process with TRITON_INTERPRET=1) and on CUDA; head gradients with their own strides; the main-gradient protocol;
and a whole GPT model's gradients with the fused split against the plain one."""
import pytest
import torch
import torch.nn as nn

from tests.runtime.dist_util import run_interpreted


def _check(device: str, dtype, s=37, b=3, heads=4, kv_heads=2, d=16) -> list[str]:
    from runtime import qkv_split as qs
    torch.manual_seed(0)
    width = (heads + 2 * kv_heads) * d
    qkv = torch.randn(s, b, width, dtype=dtype, device=device)
    bias = nn.Parameter(torch.randn(width, dtype=dtype, device=device))
    # head gradients as an attention backward may return them: dq contiguous, dk and dv with other strides
    dq = torch.randn(b, heads, s, d, dtype=dtype, device=device)
    dk = torch.randn(b, s, kv_heads, d, dtype=dtype, device=device).permute(0, 2, 1, 3)
    dv = torch.randn(s, b, kv_heads, d, dtype=dtype, device=device).permute(1, 2, 0, 3)
    ref_in = qkv.detach().double().requires_grad_(True)
    ref = qs.split_heads(ref_in, heads, kv_heads, d)
    torch.autograd.backward(ref, [dq.double(), dk.double(), dv.double()])
    want_dx, want_db = ref_in.grad, ref_in.grad.sum((0, 1))
    x = qkv.detach().requires_grad_(True)
    got = qs.split_heads_with_bias_grad(x, bias, heads, kv_heads, d)
    bad = []
    for name, a, r in zip("qkv", got, ref):
        if a.shape != r.shape or not torch.equal(a.double(), r.detach()):
            bad.append(f"forward {name} differs")
    torch.autograd.backward(got, [dq, dk, dv])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    if not torch.equal(x.grad.double(), want_dx):
        bad.append(f"input gradient {dtype}: max error {(x.grad.double() - want_dx).abs().max():.3g}")
    if not torch.allclose(bias.grad.double(), want_db, rtol=tol, atol=tol * (s * b) ** 0.5):
        bad.append(f"bias gradient {dtype}: max error {(bias.grad.double() - want_db).abs().max():.3g}")
    bias.main_grad = torch.full((width,), float("nan"), dtype=torch.float32, device=device)
    bias.main_grad_fresh = True
    for _ in range(2):
        torch.autograd.backward(qs.split_heads_with_bias_grad(qkv.detach().requires_grad_(True), bias, heads,
                                                              kv_heads, d), [dq, dk, dv])
    if not torch.allclose(bias.main_grad.double(), 2 * want_db, rtol=tol, atol=2 * tol * (s * b) ** 0.5):
        bad.append(f"main_grad {dtype}: max error {(bias.main_grad.double() - 2 * want_db).abs().max():.3g}")
    return bad


def _model_grads(family: str, fused: bool) -> dict:
    from planner.model import tiny_model
    from runtime import qkv_split as qs
    from runtime.mesh import single_process_groups
    from runtime.model import build_model
    real = qs.fused_on
    qs.fused_on = real if fused else (lambda device: False)
    try:
        torch.manual_seed(0)
        spec = tiny_model(family, num_layers=2)
        model = build_model(spec, single_process_groups(), ["none", "selective"])
        seq = torch.randint(0, spec.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
        loss, _ = model(seq[:, :-1], torch.arange(16), None, seq[:, 1:])
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    finally:
        qs.fused_on = real


def _interpreted(rank, world):
    from runtime import qkv_split as qs
    assert qs.fused_on(torch.device("cpu"))
    bad = _check("cpu", torch.float32) + _check("cpu", torch.float32, s=70, b=2, heads=12, kv_heads=12, d=32)
    for family in ("gpt", "bert"):
        plain, fused = _model_grads(family, False), _model_grads(family, True)
        if set(plain) != set(fused) or not any(n.endswith("qkv.bias") for n in plain):
            bad.append(f"{family}: parameters with gradients differ, or no qkv bias among them")
            continue
        for n in plain:
            if not torch.allclose(fused[n], plain[n], rtol=1e-5, atol=1e-6):
                bad.append(f"{family} {n}: fused split's gradient off by {(fused[n] - plain[n]).abs().max():.3g}")
    return bad


def test_fused_split_matches_autograd_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_split_matches_autograd_on_cuda(dtype):
    assert _check("cuda", dtype) == [] and _check("cuda", dtype, s=2048, b=4, heads=16, kv_heads=16, d=128) == []
