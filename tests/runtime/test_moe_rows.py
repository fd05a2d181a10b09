"""runtime/moe_rows.py: the MoE combine (weighted sum of a token's k expert outputs) and the dispatch gather's
backward, against autograd through plain indexing in float64: on the PyTorch path, under Triton's interpreter (a
worker process with TRITON_INTERPRET=1) and on CUDA."""

import pytest
import torch

from runtime import moe_rows
from tests.runtime.dist_util import run_interpreted


def _routing(tokens: int, k: int, seed: int):
    """inv / src as MoEMLP.forward builds them: rows sorted by a random expert id, src the token of each row."""
    g = torch.Generator().manual_seed(seed)
    experts = torch.randint(0, 8, (tokens * k,), generator=g)
    order = torch.argsort(experts, stable=True)
    src = torch.arange(tokens).repeat_interleave(k)[order]
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    return inv, src


def _check(device: str, dtype, tokens=37, k=2, n=80, seed=0) -> list[str]:
    torch.manual_seed(seed)
    inv, src = _routing(tokens, k, seed)
    y = torch.randn(tokens * k, n).to(dtype)
    w = torch.rand(tokens * k)
    g = torch.randn(tokens, n).to(dtype)
    # reference: out[t] = sum over the rows i of token t of w_i * y_i, by index_add in float64
    yr, wr = y.double().requires_grad_(True), w.double().requires_grad_(True)
    w_rounded = wr + (w.to(dtype).double() - wr).detach()   # the kernels round w to y's dtype, as y * w did
    want = torch.zeros(tokens, n, dtype=torch.float64).index_add(0, src, yr * w_rounded.unsqueeze(-1))
    want.backward(g.double())
    want_gather = torch.zeros(tokens, n, dtype=torch.float64).index_add(0, src, y.double())  # sum of k copies

    dev = torch.device(device)
    yd, wd = y.to(dev).requires_grad_(True), w.to(dev).requires_grad_(True)
    out = moe_rows.gather_sum(yd.detach(), inv.to(dev), k, wd.detach())
    gy, gw = moe_rows.combine_backward(g.to(dev), src.to(dev), yd.detach(), wd.detach())
    summed = moe_rows.gather_sum(y.to(dev), inv.to(dev), k)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    bad = []
    for name, got, ref, dt in (("combine", out, want, dtype), ("combine's row gradient", gy, yr.grad, dtype),
                               ("combine's weight gradient", gw, wr.grad, torch.float32),
                               ("sum of k copies", summed, want_gather, dtype)):
        if got.dtype != dt or got.shape != ref.shape:
            bad.append(f"{name}: {got.dtype} {tuple(got.shape)}, want {dt} {tuple(ref.shape)}")
        elif not torch.allclose(got.cpu().double(), ref, rtol=tol, atol=tol * n ** 0.5):
            bad.append(f"{name} {dtype}: max error {(got.cpu().double() - ref).abs().max():.3g}")
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_path_matches_indexing(dtype):
    assert _check("cpu", dtype) == []


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    # k = 2 and 1 (the EP regrouping), a row within one column block and one over several (n > 2048)
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, tokens=9, k=1, n=40, seed=1) \
        + _check("cpu", torch.float32, tokens=5, k=3, n=2100, seed=2)


def test_triton_kernels_match_indexing_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_match_indexing_on_cuda(dtype):
    assert _check("cuda", dtype) == [] and _check("cuda", dtype, tokens=8192, n=2048) == []
