"""runtime/grouped_wgrad.py: the experts' weight gradients accumulated into main_grad by the GEMM itself, against
per-expert matmuls in float64: overwrite and accumulate, experts with no rows (first, middle, last), row counts
that are not multiples of the tile, under Triton's interpreter and on CUDA."""

import pytest
import torch

from runtime import grouped_wgrad as gw
from tests.runtime.dist_util import run_interpreted


def _check(device: str, dtype, counts=(0, 5, 37, 0, 18, 0), n=40, k=24) -> list[str]:
    torch.manual_seed(0)
    rows = sum(counts)
    dy = torch.randn(rows, n).to(dtype).to(device)
    x = torch.randn(rows, k).to(dtype).to(device)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32).to(device)
    start = torch.tensor((0,) + tuple(counts)).cumsum(0)
    want = torch.stack([dy[a:b].double().t().cpu() @ x[a:b].double().cpu() for a, b in zip(start[:-1], start[1:])])
    main = torch.full((len(counts), n, k), float("nan"), dtype=torch.float32, device=device)
    bad = []
    if not gw.supported(main, dy, x):
        return [f"not supported on {device} {dtype}"]
    gw.grouped_wgrad_(main, dy, x, offs, overwrite=True)      # the step's first micro-batch: NaN must vanish
    gw.grouped_wgrad_(main, dy, x, offs, overwrite=False)     # the next adds
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    err = (main.double().cpu() - 2 * want).abs().max().item()
    if not err <= tol * (1 + 2 * want.abs().max().item()):
        bad.append(f"{device} {dtype}: max error {err:.3g}")
    return bad


def test_not_taken_without_triton_on_plain_cpu():
    import os
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("interpreter set for this process")
    x = torch.zeros(4, 8)
    assert not gw.supported(torch.zeros(2, 8, 8), x, x)


def _interpreted(rank, world):
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, counts=(3, 0, 0, 70), n=33, k=40)


def test_grouped_wgrad_matches_per_expert_matmuls_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_grouped_wgrad_matches_per_expert_matmuls_on_cuda():
    assert _check("cuda", torch.bfloat16, n=64, k=128) == []
    assert _check("cuda", torch.bfloat16, counts=(2048, 0, 1999, 2100, 0, 7, 2000, 2200), n=5632, k=2048) == []


def test_experts_write_main_grad_under_activation_checkpointing():
    """The grouped experts' weight gradient goes to the weights' main gradients (the optimizer's protocol,
    tensor.claim_main_grad) also when the layer runs under torch.utils.checkpoint: there the tensors saved for
    backward are copies without main_grad, and the gradient went to a separate tensor and a per-weight add
    (found in a full-recompute MoE step on one H200, 2026-12-03)."""
    from torch.utils.checkpoint import checkpoint

    from runtime.parallel.expert_mlp import _GroupedLinear

    torch.manual_seed(0)
    experts, n, k, counts = 3, 16, 8, torch.tensor([5, 0, 7])
    x = torch.randn(int(counts.sum()), k, requires_grad=True)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    weights = [torch.nn.Parameter(torch.randn(n, k)) for _ in range(experts)]
    dy = torch.randn(x.size(0), n)
    # reference: plain autograd gradients
    _GroupedLinear.apply(x, offs, 1, True, *weights).backward(dy)
    want = [w.grad.clone() for w in weights]
    flat = torch.full((experts * n * k,), float("nan"))
    for i, w in enumerate(weights):
        w.grad = None
        w.main_grad, w.main_grad_fresh = flat[i * n * k:(i + 1) * n * k].view(n, k), True
    y = checkpoint(lambda inp: _GroupedLinear.apply(inp, offs, 1, True, *weights), x, use_reentrant=False)
    y.backward(dy)
    for w, g in zip(weights, want):
        assert getattr(w, "grad_in_main_grad", False)
        torch.testing.assert_close(w.main_grad, g, rtol=1e-5, atol=1e-5)
