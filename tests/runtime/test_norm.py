"""runtime/norm.py: the fused residual add + LayerNorm / RMSNorm (and Gemma's (1 + weight) RMSNorm) against autograd
through PyTorch's own ops (outputs and every gradient: x, delta, weight, bias, with and without a gradient arriving at
the residual), on the eager path, under Triton's interpreter (a worker process with TRITON_INTERPRET=1) and on CUDA."""

import pytest
import torch

from runtime import norm as nm
from tests.runtime.dist_util import run_interpreted


def _reference(x, delta, w, b, eps, rms, gs, gy, unit_offset=False):
    leaves = [t.detach().double().requires_grad_(True) if t is not None else None for t in (x, delta, w, b)]
    xr, dr, wr, br = leaves
    if unit_offset:  # Gemma's RMSNorm as transformers writes it: x * rsqrt(mean(x^2) + eps) * (1 + w)
        s = xr if dr is None else xr + dr
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + wr)
    else:
        s, y = nm.residual_norm_eager(xr, dr, wr, br, eps, rms)
    loss = (y * gy.double()).sum() + ((s * gs.double()).sum() if gs is not None else 0.0)
    loss.backward()
    return s, y, [t.grad if t is not None else None for t in leaves]


def _check(device: str, dtype, rows=37, n=80, rms=False, with_delta=True, residual_grad=True,
           unit_offset=False) -> list[str]:
    torch.manual_seed(0)
    mk = lambda *shape: torch.randn(*shape).to(dtype).to(device)  # noqa: E731
    x, delta = mk(rows, n), (mk(rows, n) if with_delta else None)
    w = (1 + 0.1 * torch.randn(n)).to(dtype).to(device)
    b = None if rms else (0.1 * torch.randn(n)).to(dtype).to(device)
    gy, gs = mk(rows, n), (mk(rows, n) if residual_grad else None)
    cpu = lambda t: t.cpu() if t is not None else None  # noqa: E731
    want_s, want_y, want_grads = _reference(*(cpu(t) for t in (x, delta, w, b)), 1e-5, rms, cpu(gs), cpu(gy),
                                            unit_offset)
    leaves = [t.detach().requires_grad_(True) if t is not None else None for t in (x, delta, w, b)]
    s, y = nm.residual_norm(*leaves, 1e-5, rms, unit_offset)
    loss = (y.float() * gy.float()).sum() + ((s.float() * gs.float()).sum() if gs is not None else 0.0)
    loss.backward()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    bad = []
    for name, got, want in [("s", s, want_s), ("y", y, want_y)] + [
            (f"grad {k}", t.grad, g) for k, t, g in zip(("x", "delta", "weight", "bias"), leaves, want_grads)
            if t is not None]:
        if got is None or got.shape != want.shape:
            bad.append(f"{name}: shape {None if got is None else tuple(got.shape)}")
            continue
        scale = max(1.0, want.abs().max().item())
        err = (got.detach().cpu().double() - want).abs().max().item() / scale
        if err > tol:
            bad.append(f"{name} ({dtype}, rms={rms}, unit offset={unit_offset}, delta={with_delta}, "
                       f"residual grad={residual_grad}): "
                       f"relative error {err:.3g}")
    return bad


def _all_cases(device, dtype):
    bad = []
    for rms, unit_offset in ((False, False), (True, False), (True, True)):  # LayerNorm, RMSNorm, Gemma's RMSNorm
        for with_delta in (True, False):
            for residual_grad in (True, False):
                bad += _check(device, dtype, rms=rms, with_delta=with_delta, residual_grad=residual_grad,
                              unit_offset=unit_offset)
    return bad


def test_eager_residual_norm_matches_autograd():
    assert _all_cases("cpu", torch.float32) == []


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    assert nm._fused(torch.zeros(2, 8), None, torch.zeros(8))
    # a width that is not a power of two, rows that do not fill the last program
    return _all_cases("cpu", torch.float32) + _check("cpu", torch.float32, rows=5, n=1000) + _main_grad_protocol("cpu")


def _main_grad_protocol(device: str) -> list[str]:
    return _main_grad_case(device, None) + _main_grad_case(device, "weight first") \
        + _main_grad_case(device, "bias first")


def _main_grad_case(device: str, flat) -> list[str]:
    """With fp32 main_grad views (as the optimizer gives them), the weight and bias gradients land there:
    overwritten on the step's first use, accumulated after, and the hook is told (grad_in_main_grad). `flat`:
    both views in one flat buffer, in that order with a gap (one launch writes both), or separate tensors."""
    torch.manual_seed(2)
    rows, n = 6, 40
    x = torch.randn(rows, n, device=device)
    w = torch.nn.Parameter(torch.randn(n, device=device))
    b = torch.nn.Parameter(torch.randn(n, device=device))
    gy = torch.randn(rows, n, device=device)
    want_w, want_b = (t.detach().clone().requires_grad_(True) for t in (w, b))
    _, y = nm.residual_norm_eager(x, None, want_w, want_b, 1e-5, False)
    (y * gy).sum().backward()
    bad = []
    buf = torch.full((3 * n,), float("nan"), device=device)   # stale: must be overwritten, not read
    views = {None: (torch.full((n,), float("nan"), device=device), torch.full((n,), float("nan"), device=device)),
             "weight first": (buf[:n], buf[2 * n:]), "bias first": (buf[2 * n:], buf[n:2 * n])}[flat]
    for p, v in zip((w, b), views):
        p.main_grad = v
        p.main_grad_fresh = True
    for use in range(2):
        _, y = nm.residual_norm(x, None, w, b, 1e-5, False)
        (y * gy).sum().backward()
        for name, p, want in (("weight", w, want_w.grad), ("bias", b, want_b.grad)):
            if not getattr(p, "grad_in_main_grad", False):
                bad.append(f"{name}: hook not told (use {use})")
            if not torch.allclose(p.main_grad, (use + 1) * want, rtol=1e-4, atol=1e-4):
                bad.append(f"{name} ({flat}): main_grad after use {use} off by "
                           f"{(p.main_grad - (use + 1) * want).abs().max():.3g}")
            p.grad_in_main_grad = False
    return bad


def test_triton_residual_norm_matches_autograd_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_residual_norm_matches_autograd_on_cuda(dtype):
    assert nm._fused(torch.zeros(2, 8, device="cuda"), None, torch.zeros(8, device="cuda"))
    assert _all_cases("cuda", dtype) + _check("cuda", dtype, rows=8192, n=2048) == []
    assert _main_grad_protocol("cuda") == []


def _model_step(family: str, modes: list[str], fused: bool, monkeypatch, device: str = "cuda") -> tuple[float, dict]:
    """One training step (two micro-batches: main_grad is overwritten, then accumulated) of a tiny model on CUDA
    in fp32, through the optimizer's main gradients; the norms on the Triton path or on PyTorch's."""
    from runtime.mesh import single_process_groups
    from runtime.model import build_stage
    from runtime.parallel.data_parallel import AdamConfig, build_optimizer
    from runtime.step import train_step
    from tests.runtime.equiv import micro_batches
    from planner.model import tiny_model
    monkeypatch.setattr(nm, "_fused", nm._fused if fused else (lambda *a: False))
    spec = tiny_model(family)
    groups = single_process_groups()
    dev = torch.device(device)
    stage = build_stage(spec, groups, 0, spec.num_layers, True, True, modes, device=dev, seed=1234)
    opt = build_optimizer([stage], groups, "none", AdamConfig(lr=1e-3), compute_dtype=torch.float32)
    grads = {}

    def capture():
        grads.update({n: g.detach().cpu() for n, g in opt.full_local_grads().items()})
    mbs = [{k: v.to(dev) for k, v in mb.items()} for mb in micro_batches(spec, 0, 1, 0, 4)]
    loss, _ = train_step([stage], mbs, opt, groups, before_step=capture)
    return float(loss), grads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["gpt", "llama", "bert", "gemma"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_models_train_the_same_with_fused_and_plain_norms_on_cuda(family, mode, monkeypatch):
    """The whole model (pre-norm GPT with biases and tied embeddings, Llama's RMSNorm, BERT's post-norm), each
    recompute mode: the loss and every parameter's gradient in main_grad agree between the Triton norms
    (weights' and biases' gradients written into main_grad by the kernel) and PyTorch's."""
    from planner.model import tiny_model
    modes = [mode] * tiny_model(family).num_layers
    loss_f, grads_f = _model_step(family, modes, True, monkeypatch)
    loss_p, grads_p = _model_step(family, modes, False, monkeypatch)
    assert loss_f == pytest.approx(loss_p, rel=1e-5)
    assert grads_f.keys() == grads_p.keys()
    for name, g in grads_p.items():
        scale = max(1e-6, g.abs().max().item())
        assert (grads_f[name] - g).abs().max().item() <= 1e-4 * scale + 1e-7, name
