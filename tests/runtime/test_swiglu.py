"""runtime/swiglu.py: the SwiGLU's forward and gradient against autograd through PyTorch's own ops, on the eager
path (chunked or not), under Triton's interpreter (a worker process with TRITON_INTERPRET=1) and on CUDA."""

import pytest
import torch

from runtime import swiglu as sw
from tests.runtime.dist_util import run_interpreted


def _reference(x, g):
    xr = x.detach().double().requires_grad_(True)
    y = sw.swiglu_eager(xr)
    y.backward(g.double())
    return y, xr.grad


def _check(device: str, dtype, rows=37, f=80) -> list[str]:
    torch.manual_seed(0)
    x = (3 * torch.randn(rows, 2 * f)).to(dtype).to(device)
    g = torch.randn(rows, f).to(dtype).to(device)
    want_y, want_dx = _reference(x.cpu(), g.cpu())
    xg = x.detach().requires_grad_(True)
    y = sw.swiglu(xg)
    y.backward(g)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    bad = []
    if y.shape != (rows, f) or y.dtype != dtype:
        bad.append(f"forward shape {tuple(y.shape)} {y.dtype}")
    if not torch.allclose(y.cpu().double(), want_y, rtol=tol, atol=tol):
        bad.append(f"forward {dtype}: max error {(y.cpu().double() - want_y).abs().max():.3g}")
    if not torch.allclose(xg.grad.cpu().double(), want_dx, rtol=tol, atol=tol):
        bad.append(f"backward {dtype}: max error {(xg.grad.cpu().double() - want_dx).abs().max():.3g}")
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_swiglu_matches_autograd(dtype):
    assert _check("cpu", dtype) == []


def test_chunked_eager_backward_gives_the_unchunked_gradient(monkeypatch):
    torch.manual_seed(1)
    x, g = torch.randn(4, 9, 2 * 24), torch.randn(4, 9, 24)
    whole = sw.swiglu_backward_eager(x, g)
    monkeypatch.setattr(sw, "_CHUNK_ELEMS", 100)   # 2 rows of 48 per chunk: 18 chunks, the last one short
    assert torch.equal(sw.swiglu_backward_eager(x, g), whole)
    assert whole.shape == x.shape


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, rows=3, f=1500)  # f over one block


def test_triton_swiglu_matches_autograd_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_swiglu_matches_autograd_on_cuda(dtype):
    assert _check("cuda", dtype) == []
