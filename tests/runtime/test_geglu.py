"""runtime/geglu.py: GeGLU's forward and gradient, in both GELU forms, against autograd through PyTorch's own ops, on
the eager path (chunked backward or not), under Triton's interpreter (a worker process with TRITON_INTERPRET=1) and on
CUDA, and what it keeps for backward: its input alone, as the planner's memory model counts."""

import pytest
import torch
import torch.nn.functional as F

from runtime import geglu as gg
from tests.runtime.dist_util import run_interpreted


def _reference(x, g, approximate):
    xr = x.detach().double().requires_grad_(True)
    gate, up = xr.chunk(2, dim=-1)
    y = F.gelu(gate, approximate=approximate) * up
    y.backward(g.double())
    return y, xr.grad


def _check(device: str, dtype, approximate: str, rows=37, f=80) -> list[str]:
    torch.manual_seed(0)
    x = (3 * torch.randn(rows, 2 * f)).to(dtype)
    g = torch.randn(rows, f).to(dtype)
    want_y, want_dx = _reference(x, g, approximate)
    xg = x.to(device).detach().requires_grad_(True)
    y = gg.geglu(xg, approximate)
    y.backward(g.to(device))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    bad = []
    if y.shape != (rows, f) or y.dtype != dtype:
        bad.append(f"forward shape {tuple(y.shape)} {y.dtype}")
    if not torch.allclose(y.cpu().double(), want_y, rtol=tol, atol=tol):
        bad.append(f"forward {dtype} {approximate}: max error {(y.cpu().double() - want_y).abs().max():.3g}")
    if not torch.allclose(xg.grad.cpu().double(), want_dx, rtol=tol, atol=tol):
        bad.append(f"backward {dtype} {approximate}: max error {(xg.grad.cpu().double() - want_dx).abs().max():.3g}")
    return bad


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_geglu_matches_autograd(approximate, dtype):
    assert _check("cpu", dtype, approximate) == []


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu")) and gg._fused(torch.zeros(2, 8))
    return [e for a in ("tanh", "none") for e in _check("cpu", torch.float32, a)
            + _check("cpu", torch.float32, a, rows=3, f=1500)]  # f over one block


def test_triton_geglu_matches_autograd_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_geglu_matches_autograd_on_cuda(dtype):
    assert _check("cuda", dtype, "tanh") + _check("cuda", dtype, "none") + _check("cuda", dtype, "tanh", 8192, 2048) \
        == []


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
