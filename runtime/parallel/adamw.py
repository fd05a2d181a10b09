"""AdamW over flat fp32 shards that also writes the updated weights in the compute dtype, in one pass.

The distributed optimizer (runtime/parallel/data.py) updates contiguous segments of its flat buffers: the
fp32 master weights, the fp32 (main) gradient, Adam's m and v, and the bf16 parameters the model computes
with. PyTorch's fused AdamW (`torch._fused_adamw_`) covers the first four; the bf16 copy would be another
pass over 6 bytes per parameter. On CUDA a small Triton kernel does both (reads 16 B, writes 14 B per
parameter); elsewhere (CPU runs, no Triton) PyTorch's fused kernel runs, then the copy; the tests run the
Triton kernel under Triton's interpreter too. Both compute
PyTorch's AdamW exactly (decoupled weight decay first, then the bias-corrected update); the gradient is
divided by `divisor` (gradient clipping) as it is read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runtime.triton_support import tl, triton, use_triton


@dataclass
class Segment:
    """One contiguous piece of a shard: views of equal length into the flat buffers."""
    master: torch.Tensor
    grad: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor
    param: torch.Tensor
    """The compute-dtype weights (bf16 on GPU); may be the master itself when both are fp32."""
    decay: bool


if triton is not None:
    @triton.jit
    def _adamw_kernel(master_ptr, grad_ptr, m_ptr, v_ptr, param_ptr, divisor_ptr, n, lr, beta1, beta2, eps,
                      decay_factor, step_size, bc2_sqrt, HAS_DIVISOR: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0)
        if HAS_DIVISOR:
            g = g / tl.load(divisor_ptr)
        p = tl.load(master_ptr + offs, mask=mask, other=0.0) * decay_factor
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        m = m + (1.0 - beta1) * (g - m)
        v = beta2 * v + (1.0 - beta2) * g * g
        p = p - step_size * m / (tl.sqrt(v) / bc2_sqrt + eps)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(master_ptr + offs, p, mask=mask)
        tl.store(param_ptr + offs, p.to(param_ptr.dtype.element_ty), mask=mask)


def adamw_(segments: list[Segment], step: int, lr: float, betas: tuple[float, float], eps: float,
           weight_decay: float, divisor: torch.Tensor | None = None, step_tensor: torch.Tensor | None = None,
           force_torch: bool = False) -> None:
    """One AdamW step (step counts from 1) over every segment, in place; decay only where seg.decay."""
    if not segments:
        return
    b1, b2 = betas
    if use_triton(segments[0].master.device) and not force_torch:
        step_size = lr / (1 - b1 ** step)
        bc2_sqrt = math.sqrt(1 - b2 ** step)
        block = 2048
        for s in segments:
            n = s.master.numel()
            if n == 0:
                continue
            _adamw_kernel[(triton.cdiv(n, block),)](
                s.master, s.grad, s.m, s.v, s.param, divisor if divisor is not None else s.master, n, lr, b1, b2,
                eps, 1.0 - lr * weight_decay if s.decay else 1.0, step_size, bc2_sqrt,
                HAS_DIVISOR=divisor is not None, BLOCK=block)
        return
    if step_tensor is None:
        step_tensor = torch.tensor(float(step), device=segments[0].master.device)
    else:
        step_tensor.fill_(float(step))
    for decay in (True, False):
        group = [s for s in segments if s.decay == decay and s.master.numel()]
        if group:
            torch._fused_adamw_([s.master for s in group], [s.grad for s in group], [s.m for s in group],
                                [s.v for s in group], [], [step_tensor] * len(group), lr=lr, beta1=b1, beta2=b2,
                                weight_decay=weight_decay if decay else 0.0, eps=eps, amsgrad=False,
                                maximize=False, grad_scale=divisor)
    for s in segments:
        if s.param.data_ptr() != s.master.data_ptr():
            s.param.copy_(s.master)
