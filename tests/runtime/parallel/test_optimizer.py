"""The distributed optimizer on one process against plain PyTorch: gradients accumulated over micro-batches
(with the weight-gradient GEMMs writing straight into the fp32 main gradient) equal autograd's summed
.grad, and the fused AdamW step with clipping equals torch.optim.AdamW on the clipped gradients."""
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from planner.model import tiny_model
from runtime.mesh import single_process_groups
from runtime.model import build_model
from runtime.parallel.adamw import AdamConfig
from runtime.parallel.distributed_optimizer import DistributedOptimizer
from runtime.parallel.tensor import weight_grad


def _batches(spec, n, seed=7):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, spec.vocab_size, (n, 2, 17), generator=g)
    return [dict(tokens=s[:, :-1], labels=s[:, 1:]) for s in seq]


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_fused_accumulation_and_adamw_match_plain_pytorch(family):
    torch.manual_seed(0)
    spec = tiny_model(family)
    groups = single_process_groups()
    ours = build_model(spec, groups)
    plain = copy.deepcopy(ours)  # parameters of its own, no main_grad attribute: ordinary autograd
    for p in plain.parameters():
        if hasattr(p, "main_grad"):
            del p.main_grad
    cfg = AdamConfig(lr=1e-2, weight_decay=0.1, grad_clip=0.05)  # small clip: clipping is exercised
    opt = DistributedOptimizer([ours], groups, "none", cfg, bucket_elems=3000)
    fused = [n for n, p in ours.named_parameters() if hasattr(p, "main_grad")]
    assert fused, "column/row-parallel weights get a main_grad view"

    batches = _batches(spec, 3)
    opt.zero_grad()
    for i, mb in enumerate(batches):
        opt.begin_micro_batch(last=i == len(batches) - 1)
        loss, _ = ours(mb["tokens"], None, None, mb["labels"])
        loss.backward()
        loss_p, _ = plain(mb["tokens"], None, None, mb["labels"])
        loss_p.backward()
    opt.finish_grads()
    ours_grads = opt.full_local_grads()
    for n, p in plain.named_parameters():
        torch.testing.assert_close(ours_grads[n], p.grad, rtol=1e-5, atol=1e-6, msg=n)
    for n, p in ours.named_parameters():
        assert p.grad is None, f"{n}: the optimizer frees each gradient once it is in the main buffer"

    norm = float(opt.clip_grad_norm())
    want = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in plain.parameters()]))
    assert norm == pytest.approx(float(want), rel=1e-5)
    assert norm > cfg.grad_clip
    opt.step()

    decay = [p for p in plain.parameters() if p.dim() >= 2]
    rest = [p for p in plain.parameters() if p.dim() < 2]
    ref = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-2, betas=cfg.betas, eps=cfg.eps)
    torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.grad_clip)
    ref.step()
    for (n, p), q in zip(ours.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=n)


def test_weight_grad_without_main_grad_is_the_plain_gemm():
    w = torch.randn(5, 3)
    gy, x = torch.randn(4, 2, 5), torch.randn(4, 2, 3)
    torch.testing.assert_close(weight_grad(w, gy, x), gy.reshape(-1, 5).t() @ x.reshape(-1, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 GEMM into an fp32 output needs CUDA")
def test_bf16_weight_grad_accumulates_in_fp32_on_cuda():
    w = torch.nn.Parameter(torch.zeros(256, 128, device="cuda", dtype=torch.bfloat16))
    w.main_grad = torch.randn(256, 128, device="cuda")
    start = w.main_grad.clone()
    gy = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    weight_grad(w, gy, x)
    want = start + gy.float().t() @ x.float()
    torch.testing.assert_close(w.main_grad, want, rtol=1e-4, atol=1e-3)


def _adamw_paths_agree(device: str, n: int) -> bool:
    """The Triton AdamW against torch's fused AdamW (+ copy) over two segments, three steps, with a clip
    divisor; raises on a mismatch."""
    from runtime.parallel.adamw import Segment, adamw_
    from runtime.triton_support import use_triton

    assert use_triton(torch.device(device))
    cut = n * 3 // 5

    def state():
        g = torch.Generator(device=device).manual_seed(1)
        t = {k: torch.randn(n, device=device, generator=g) for k in ("master", "grad", "m")}
        t["v"] = torch.rand(n, device=device, generator=g)
        t["param"] = t["master"].to(torch.bfloat16)
        return t

    a, b = state(), state()
    div = torch.tensor(3.0, device=device)
    for step in (1, 2, 7):
        for t, force in ((a, False), (b, True)):
            segs = [Segment(t["master"][:cut], t["grad"][:cut], t["m"][:cut], t["v"][:cut], t["param"][:cut], True),
                    Segment(t["master"][cut:], t["grad"][cut:], t["m"][cut:], t["v"][cut:], t["param"][cut:], False)]
            adamw_(segs, step, 1e-2, (0.9, 0.95), 1e-8, 0.1, div.clone(), force_torch=force)
            t["grad"].copy_(state()["grad"])  # torch's kernel writes the divided gradient back
    for k in ("master", "m", "v"):
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    # the interpreter's bf16 conversion may truncate where CUDA rounds: one bf16 step apart at most
    torch.testing.assert_close(a["param"].float(), b["param"].float(), rtol=2 ** -7, atol=0)
    return True


def _interpreted(rank, world):
    return _adamw_paths_agree("cpu", 10_003)


def test_triton_adamw_matches_torch_fused_adamw_interpreted(monkeypatch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from tests.runtime.dist_util import run_workers
    assert run_workers(_interpreted, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton AdamW kernel runs on CUDA")
def test_triton_adamw_matches_torch_fused_adamw_on_cuda():
    assert _adamw_paths_agree("cuda", 100_003)


def test_fresh_main_grad_is_overwritten_not_accumulated():
    """After zero_grad the fused weights' main_grad views are not cleared; the step's first weight-gradient
    GEMM overwrites them (whatever they held, NaN included) and later micro-batches add."""
    w = torch.nn.Parameter(torch.zeros(5, 3))
    w.main_grad = torch.full((5, 3), float("nan"))
    w.main_grad_fresh = True
    gy, x = torch.randn(4, 5), torch.randn(4, 3)
    weight_grad(w, gy, x)
    torch.testing.assert_close(w.main_grad, gy.t() @ x)
    assert not w.main_grad_fresh
    weight_grad(w, gy, x)
    torch.testing.assert_close(w.main_grad, 2 * gy.t() @ x)


def test_weight_gradient_goes_to_main_grad_under_activation_checkpointing():
    """torch.utils.checkpoint hands backward a recomputed copy of the weight that lacks main_grad; the layer
    must still accumulate into the Parameter's main_grad (fused path), not return a separate gradient."""
    from torch.utils.checkpoint import checkpoint

    from runtime.parallel.tensor import ColumnParallelLinear

    torch.manual_seed(0)
    lin = ColumnParallelLinear(4, [3], False, None)
    lin.weight.main_grad = torch.full((3, 4), float("nan"))
    lin.weight.main_grad_fresh = True
    x = torch.randn(2, 1, 4)
    checkpoint(lin, x, use_reentrant=False).sum().backward()
    torch.testing.assert_close(lin.weight.main_grad, torch.ones(2, 3).t() @ x.reshape(2, 4))
    assert lin.weight.grad_in_main_grad
