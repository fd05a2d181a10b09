"""runtime/geglu.py: GeGLU's forward and gradient, in both GELU forms, against autograd through PyTorch's own ops
(chunked backward or not), and what it keeps for backward: its input alone, as the planner's memory model counts."""

import pytest
import torch
import torch.nn.functional as F

from runtime import geglu as gg


def _reference(x, g, approximate):
    xr = x.detach().double().requires_grad_(True)
    gate, up = xr.chunk(2, dim=-1)
    y = F.gelu(gate, approximate=approximate) * up
    y.backward(g.double())
    return y, xr.grad


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu_matches_autograd(approximate, dtype):
    torch.manual_seed(0)
    x = (3 * torch.randn(37, 160)).to(dtype)
    g = torch.randn(37, 80).to(dtype)
    want_y, want_dx = _reference(x, g, approximate)
    xg = x.detach().requires_grad_(True)
    y = gg.geglu(xg, approximate)
    y.backward(g)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert y.shape == (37, 80) and y.dtype == dtype
    assert torch.allclose(y.double(), want_y, rtol=tol, atol=tol), (y.double() - want_y).abs().max()
    assert torch.allclose(xg.grad.double(), want_dx, rtol=tol, atol=tol), (xg.grad.double() - want_dx).abs().max()


def test_the_two_forms_differ():
    x = torch.linspace(-3, 3, 64).repeat(2).view(1, 128)
    assert not torch.allclose(gg.geglu(x, "tanh"), gg.geglu(x, "none"), atol=1e-6)


def test_chunked_backward_gives_the_unchunked_gradient(monkeypatch):
    torch.manual_seed(1)
    x, g = torch.randn(4, 9, 2 * 24), torch.randn(4, 9, 24)
    whole = gg.geglu_backward(x, g, "tanh")
    monkeypatch.setattr(gg, "_CHUNK_ELEMS", 100)   # 2 rows of 48 per chunk: 18 chunks, the last one short
    assert torch.equal(gg.geglu_backward(x, g, "tanh"), whole)


def test_keeps_only_its_input():
    saved = []

    def pack(t):
        saved.append(t)
        return t
    x = torch.randn(8, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        gg.geglu(x * 1.0, "tanh").sum()
    assert [tuple(t.shape) for t in saved] == [(8, 64)]
