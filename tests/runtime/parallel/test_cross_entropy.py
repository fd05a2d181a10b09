"""The vocabulary-parallel cross-entropy (runtime/parallel/cross_entropy.py) against F.cross_entropy on the
full vocabulary: loss and gradient of the logits, with ignored targets, on one rank and with the vocabulary
split over two (gloo). Both implementations are checked: PyTorch's, and the Triton kernels run by Triton's
interpreter on CPU tensors (TRITON_INTERPRET=1 in the worker processes; skipped without Triton)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tests.runtime.dist_util import run_workers

N, V = 37, 1000


def _case(dtype):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(N, V, generator=g) * 3).to(dtype)
    target = torch.randint(0, V, (N,), generator=g)
    target[[3, 11]] = -100
    scale = torch.rand(N, generator=g)  # a per-token incoming gradient
    return logits, target, scale


def _worker(rank, world, fused, dtype):
    import torch.distributed as dist
    from runtime.parallel.cross_entropy import vocab_parallel_cross_entropy
    logits, target, scale = _case(dtype)
    group = dist.group.WORLD if world > 1 else None
    x = logits.chunk(world, dim=-1)[rank].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(x, target, group, -100, fused=fused)
    (loss * scale).sum().backward()
    grads = [torch.empty_like(x.grad) for _ in range(world)]
    dist.all_gather(grads, x.grad) if world > 1 else grads.__setitem__(0, x.grad)
    return loss.detach(), torch.cat(grads, dim=-1).float()


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("fused", [False, True], ids=["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_full_vocabulary_cross_entropy(world, fused, dtype, monkeypatch):
    if fused:
        if importlib.util.find_spec("triton") is None:
            pytest.skip("Triton is not installed")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    logits, target, scale = _case(dtype)
    ref_x = logits.float().requires_grad_()
    ref = F.cross_entropy(ref_x, target, reduction="none", ignore_index=-100)
    (ref * scale).sum().backward()
    loss, grad = run_workers(_worker, world, fused, dtype)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-5)
    assert (loss[[3, 11]] == 0).all() and (grad[[3, 11]] == 0).all(), "ignored targets: no loss, no gradient"
    # the gradient is stored in the logits' dtype: bf16 keeps 8 bits of mantissa
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(grad, ref_x.grad, **tol)
