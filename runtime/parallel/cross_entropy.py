"""Vocabulary-parallel cross-entropy in two passes over the logits: statistics in forward, gradient in backward.

The logits [N, V/t] of a rank hold a slice of the vocabulary (tensor parallelism splits the output layer by
rows). Per token the loss is logsumexp over the whole vocabulary minus the target's logit, so each rank
reduces its slice to three fp32 numbers per token (its max, its sum of exp(x - max), the target's logit if
the target falls in its slice) and the TP group combines them: one all-reduce (max) and one (sum).

Forward keeps the logits themselves (compute dtype) and the per-token logsumexp; backward writes the
gradient, (softmax - one_hot) x the incoming per-token gradient, over the logits' own buffer in one pass
(backward runs once). Megatron instead keeps an fp32 softmax beside the logits; this keeps V/t values per
token in the compute dtype (2 bytes in bf16), which planner/memory/activations.py counts.

On CUDA two Triton kernels do the work: one pass over the logits for the per-token statistics (online
max / sum-exp) and one that reads them again and writes the gradient in place. Elsewhere (CPU runs and
tests, or without Triton) the same arithmetic runs in PyTorch in fp32. Triton's interpreter
(TRITON_INTERPRET=1) runs the kernels on CPU tensors, which is how the tests check them against PyTorch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.parallel.tensor import group_rank, group_size
from runtime.triton_support import tl, triton, use_triton

_BLOCK_V = 4096


if triton is not None:
    @triton.jit
    def _row_stats_kernel(logits_ptr, stride, target_ptr, max_ptr, sumexp_ptr, picked_ptr, v_local,
                          BLOCK: tl.constexpr):
        """Per row: max of the row, sum of exp(x - max), and the logit at the (local) target or 0."""
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * stride
        m = tl.full((), float("-inf"), tl.float32)
        s = tl.zeros((), tl.float32)
        for start in range(0, v_local, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < v_local, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        t = tl.load(target_ptr + row)
        inside = (t >= 0) & (t < v_local)
        picked = tl.load(base + tl.where(inside, t, 0)).to(tl.float32)
        tl.store(max_ptr + row, m)
        tl.store(sumexp_ptr + row, s)
        tl.store(picked_ptr + row, tl.where(inside, picked, 0.0))

    @triton.jit
    def _grad_kernel(logits_ptr, stride, target_ptr, lse_ptr, scale_ptr, v_local, BLOCK: tl.constexpr):
        """logits <- (softmax - one_hot(target)) * scale for one block of one row, in place."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < v_local
        ptr = logits_ptr + row * stride + cols
        x = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - tl.load(lse_ptr + row))
        p = tl.where(cols == tl.load(target_ptr + row), p - 1.0, p) * tl.load(scale_ptr + row)
        tl.store(ptr, p.to(logits_ptr.dtype.element_ty), mask=mask)


def _block(v_local: int) -> int:
    return min(_BLOCK_V, triton.next_power_of_2(v_local))


def _row_stats(logits: torch.Tensor, local_target: torch.Tensor, fused: bool):
    """(max, sum of exp(x - max), logit at the local target or 0), each fp32 [N]; local_target outside
    [0, V/t) means the target lies on another rank."""
    n, v_local = logits.shape
    if fused:
        out = torch.empty((3, n), dtype=torch.float32, device=logits.device)
        _row_stats_kernel[(n,)](logits, logits.stride(0), local_target, out[0], out[1], out[2], v_local,
                                BLOCK=_block(v_local))
        return out[0], out[1], out[2]
    x = logits.float()
    m = x.max(dim=-1).values
    sumexp = (x - m.unsqueeze(-1)).exp_().sum(-1)
    inside = (local_target >= 0) & (local_target < v_local)
    picked = x.gather(-1, local_target.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
    return m, sumexp, picked


def _logit_grad_(logits: torch.Tensor, local_target: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor,
                 fused: bool) -> torch.Tensor:
    """Overwrite logits with (softmax - one_hot) * scale per row (scale fp32 [N]); returns logits."""
    n, v_local = logits.shape
    if fused:
        block = _block(v_local)
        _grad_kernel[(n, triton.cdiv(v_local, block))](logits, logits.stride(0), local_target, lse, scale, v_local,
                                                       BLOCK=block)
        return logits
    grad = (logits.float() - lse.unsqueeze(-1)).exp_()
    inside = (local_target >= 0) & (local_target < v_local)
    grad.scatter_add_(-1, local_target.clamp(0, v_local - 1).unsqueeze(-1), -inside.to(grad.dtype).unsqueeze(-1))
    return logits.copy_(grad.mul_(scale.unsqueeze(-1)))


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, ignore_index, fused):
        v_local = logits.shape[-1]
        start = group_rank(group) * v_local
        local_target = target - start  # outside [0, v_local): another rank's slice (or ignore_index)
        m, sumexp, picked = _row_stats(logits, local_target, fused)
        if group_size(group) > 1:
            m_all = m.clone()
            dist.all_reduce(m_all, op=dist.ReduceOp.MAX, group=group)
            both = torch.stack([sumexp * torch.exp(m - m_all), picked])
            dist.all_reduce(both, group=group)
            m, sumexp, picked = m_all, both[0], both[1]
        valid = target != ignore_index
        lse = m + sumexp.log()
        ctx.save_for_backward(logits, local_target, lse, valid)
        ctx.fused = fused
        return (lse - picked).masked_fill(~valid, 0.0)

    @staticmethod
    def backward(ctx, grad_loss):
        logits, local_target, lse, valid = ctx.saved_tensors
        scale = (grad_loss.float() * valid).contiguous()
        return _logit_grad_(logits, local_target, lse, scale, ctx.fused), None, None, None, None


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int, group) -> None:
    """Set, in place, the logits of the padded vocabulary rows (ids >= vocab_size, ModelSpec.padded_vocab) of this
    rank's slice [..., V/t] to the dtype's lowest value, so that the softmax and the loss are those of the real
    vocabulary, as Hugging Face's models compute them, and the padded rows get no gradient."""
    width = logits.shape[-1]
    keep = min(max(vocab_size - group_rank(group) * width, 0), width)
    if keep < width:
        logits[..., keep:] = torch.finfo(logits.dtype).min


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group, ignore_index: int = -100,
                                 fused: bool | None = None) -> torch.Tensor:
    """Per-token loss (fp32, 0 at ignored targets). logits [N, V/t] (this rank's vocabulary slice, contiguous;
    its buffer is overwritten by the gradient in backward, so nothing else may read it afterwards), target [N]
    (global vocabulary ids). fused: Triton kernels (default: where use_triton says they run)."""
    if fused is None:
        fused = use_triton(logits.device)
    return _VocabParallelCE.apply(logits.contiguous(), target.contiguous(), group, ignore_index, fused)
