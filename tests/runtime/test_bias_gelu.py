"""runtime/bias_gelu.py: gelu_tanh(y + b) and its gradients (y's and the bias's) against autograd through PyTorch's
own ops in float64, on the eager path, under Triton's interpreter (a worker process with TRITON_INTERPRET=1) and on
CUDA; and the main-gradient protocol (the step's first backward overwrites the bias's main_grad, later ones add)."""

import pytest
import torch
import torch.nn as nn

from runtime import bias_gelu as bg
from tests.runtime.dist_util import run_interpreted


def _reference(y, b, g):
    yr, br = y.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    out = bg.bias_gelu_eager(yr, br)
    out.backward(g.double())
    return out, yr.grad, br.grad


def _check(device: str, dtype, rows=37, n=80) -> list[str]:
    torch.manual_seed(0)
    y = (2 * torch.randn(rows, n)).to(dtype).to(device)
    b = torch.randn(n).to(dtype).to(device)
    g = torch.randn(rows, n).to(dtype).to(device)
    want, want_dy, want_db = _reference(y.cpu(), b.cpu(), g.cpu())
    yg, bp = y.detach().requires_grad_(True), nn.Parameter(b.detach().clone())
    out = bg.bias_gelu(yg, bp)
    out.backward(g)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    bad = []
    if out.shape != y.shape or out.dtype != dtype:
        bad.append(f"forward shape {tuple(out.shape)} {out.dtype}")
    for name, got, ref, scale in (("forward", out, want, 1.0), ("input gradient", yg.grad, want_dy, 1.0),
                                  ("bias gradient", bp.grad, want_db, rows ** 0.5)):
        if not torch.allclose(got.cpu().double(), ref, rtol=tol, atol=tol * scale):
            bad.append(f"{name} {dtype}: max error {(got.cpu().double() - ref).abs().max():.3g}")
    # the main-gradient protocol: overwrite on the step's first backward, then accumulate
    bp.main_grad = torch.full_like(bp, float("nan"), dtype=torch.float32)
    bp.main_grad_fresh = True
    for _ in range(2):
        bg.bias_gelu(y.detach().requires_grad_(True), bp).backward(g)
    if not torch.allclose(bp.main_grad.cpu().double(), 2 * want_db, rtol=tol, atol=2 * tol * scale):
        bad.append(f"main_grad {dtype}: max error {(bp.main_grad.cpu().double() - 2 * want_db).abs().max():.3g}")
    if not getattr(bp, "grad_in_main_grad", False):
        bad.append("grad_in_main_grad not set for the optimizer's hook")
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_bias_gelu_matches_autograd(dtype):
    assert _check("cpu", dtype) == []


def test_recompute_forward_equals_the_autograd_forward():
    torch.manual_seed(2)
    y, b = torch.randn(5, 7, 40), torch.randn(40)
    assert torch.equal(bg.bias_gelu_forward(y, b), bg.bias_gelu(y, b))


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    # one program; several row programs (rows over _BWD_ROWS_PER_PROG) and columns over one block
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, rows=150, n=1100)


def test_triton_bias_gelu_matches_autograd_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_bias_gelu_matches_autograd_on_cuda(dtype):
    assert _check("cuda", dtype) == [] and _check("cuda", dtype, rows=8192, n=2048) == []
