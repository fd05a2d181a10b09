"""AdamW over flat fp32 shards that also writes the updated weights in the compute dtype, in one pass.

The distributed optimizer (runtime/parallel/distributed_optimizer.py) updates contiguous segments of its flat buffers: the
fp32 master weights, the (main) gradient (fp32, or bf16 under a plan's grad_dtype), Adam's m and v, and the bf16 parameters the model computes
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

from planner.lr_schedule import ADAM_BETAS, ADAM_EPS, DEFAULT_CLIP_GRAD, DEFAULT_PEAK_LR, DEFAULT_WEIGHT_DECAY
from runtime.triton_support import tl, triton, use_triton


class AdamConfig:
    """AdamW's settings (defaults: planner/lr_schedule.py, where `plan launch`'s options are declared)."""

    def __init__(self, lr=DEFAULT_PEAK_LR, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=DEFAULT_WEIGHT_DECAY,
                 grad_clip=DEFAULT_CLIP_GRAD):
        self.lr, self.betas, self.eps, self.weight_decay, self.grad_clip = lr, betas, eps, weight_decay, grad_clip



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
    def _adamw_kernel(master_ptr, grad_ptr, m_ptr, v_ptr, param_ptr, divisor_ptr, scalars_ptr, n, beta1, beta2, eps,
                      DECAY: tl.constexpr, HAS_DIVISOR: tl.constexpr, BLOCK: tl.constexpr):
        # the step's scalars come from device memory (adamw_scalars), not kernel arguments, so that a CUDA
        # graph that captured this launch replays every step with that step's learning rate and bias corrections
        step_size = tl.load(scalars_ptr + 1)
        bc2_sqrt = tl.load(scalars_ptr + 2)
        decay_factor = tl.load(scalars_ptr + 3) if DECAY else 1.0
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # fp32 or bf16 main gradients
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


def adamw_scalars(step: int, lr: float, betas: tuple[float, float], weight_decay: float) -> list[float]:
    """[lr, step size (lr over the first bias correction), sqrt of the second bias correction, decay factor]
    of AdamW step `step` (from 1), computed in double on the host as PyTorch's AdamW does."""
    b1, b2 = betas
    return [lr, lr / (1 - b1 ** step), math.sqrt(1 - b2 ** step), 1.0 - lr * weight_decay]


def write_scalars(dest: torch.Tensor, values: list[float]) -> None:
    """Write the step's scalars into a 4-float device tensor by one fill per value: the values travel as kernel
    arguments, so nothing waits for the GPU (a copy from pageable host memory would) and nothing on the host
    has to outlive the queued copy (a pinned buffer would)."""
    for i, v in enumerate(values):
        dest[i].fill_(v)


def adamw_(segments: list[Segment], step: int, lr: float, betas: tuple[float, float], eps: float,
           weight_decay: float, divisor: torch.Tensor | None = None, step_tensor: torch.Tensor | None = None,
           force_torch: bool = False, scalars: torch.Tensor | None = None, scalars_written: bool = False) -> None:
    """One AdamW step (step counts from 1) over every segment, in place; decay only where seg.decay.
    scalars: the 4-float device tensor the Triton kernel reads the step's scalars from (adamw_scalars); written
    here from (step, lr) unless scalars_written (a CUDA graph's replay: the caller wrote them before it)."""
    if not segments:
        return
    b1, b2 = betas
    if use_triton(segments[0].master.device) and not force_torch:
        if scalars is None:
            scalars = torch.empty(4, dtype=torch.float32, device=segments[0].master.device)
        if not scalars_written:
            write_scalars(scalars, adamw_scalars(step, lr, betas, weight_decay))
        block = 2048
        for s in segments:
            n = s.master.numel()
            if n == 0:
                continue
            _adamw_kernel[(triton.cdiv(n, block),)](
                s.master, s.grad, s.m, s.v, s.param, divisor if divisor is not None else s.master, scalars, n, b1, b2,
                eps, DECAY=s.decay and weight_decay != 0.0, HAS_DIVISOR=divisor is not None, BLOCK=block)
        return
    if scalars_written:
        raise ValueError("precomputed AdamW scalars need the Triton kernel (CUDA with Triton)")
    if step_tensor is None:
        step_tensor = torch.tensor(float(step), device=segments[0].master.device)
    else:
        step_tensor.fill_(float(step))
    for decay in (True, False):
        group = [s for s in segments if s.decay == decay and s.master.numel()]
        if group:
            # torch's kernel wants the gradients in the master's dtype (bf16 main gradients: fp32 copies)
            grads = [s.grad if s.grad.dtype == s.master.dtype else s.grad.to(s.master.dtype) for s in group]
            torch._fused_adamw_([s.master for s in group], grads, [s.m for s in group],
                                [s.v for s in group], [], [step_tensor] * len(group), lr=lr, beta1=b1, beta2=b2,
                                weight_decay=weight_decay if decay else 0.0, eps=eps, amsgrad=False,
                                maximize=False, grad_scale=divisor)
    for s in segments:
        if s.param.data_ptr() != s.master.data_ptr():
            s.param.copy_(s.master)
