"""LayerNorm / RMSNorm (runtime/norm.py): the Triton kernels, run by Triton's interpreter on CPU tensors in a
worker process (TRITON_INTERPRET=1), against torch's F.layer_norm / F.rms_norm: output and the gradients of
input, weight and bias. Skipped without Triton."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tests.runtime.dist_util import run_workers


def _case(rms, dtype, rows=70, cols=48):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(rows, 2, cols, generator=g) * 2 + 0.5).to(dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=g)).to(dtype)
    b = None if rms else (0.1 * torch.randn(cols, generator=g)).to(dtype)
    dy = torch.randn(rows, 2, cols, generator=g).to(dtype)
    return x, w, b, dy


def _grads(fn, x, w, b, dy):
    leaves = [t.clone().requires_grad_() for t in (x, w) + ((b,) if b is not None else ())]
    y = fn(*leaves)
    y.backward(dy)
    return [y.detach().float()] + [t.grad.float() for t in leaves]


def _worker(rank, world, rms, dtype):
    from runtime.norm import norm
    x, w, b, dy = _case(rms, dtype)
    return _grads(lambda x, w, b=None: norm(x, w, b, 1e-5, rms, fused=True), x, w, b, dy)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_norm_matches_torch(rms, dtype, monkeypatch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, w, b, dy = _case(rms, torch.float32)
    if rms:
        ref = _grads(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-5), x, w, b, dy)
    else:
        ref = _grads(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), x, w, b, dy)
    got = run_workers(_worker, 1, rms, dtype)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=8e-2)
    for name, a, r in zip(["y", "dx", "dw", "db"], got, ref):
        torch.testing.assert_close(a, r, msg=name, **tol)
