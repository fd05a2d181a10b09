"""The fused qkv GEMM output split into attention heads, whose backward also gives the qkv bias's gradient.

Forward: qkv [s, b, (heads + 2 kv_heads) d] -> q [b, heads, s, d], k, v [b, kv_heads, s, d], views (no copy),
as Attention.core always split it. Backward: the three head gradients are written back into one [s, b, width]
tensor (what autograd's split backward does with a concatenation) and, in the same pass, per-program column
sums of it, which runtime/norm.py's sum_partials adds into the qkv bias's main gradient (or a new tensor). The
qkv linear layer then skips its own bias sum (ColumnParallelLinear's bias_grad=False). Why: that sum read
the [tokens, width] gradient again right after the concatenation wrote it (session 11 call r6: 24 x 50 us of
concatenation and 24 x 40 us of bias sum in a GPT-1.3B step on one H200).

For models without rotary embeddings and with biases (GPT, BERT); on CUDA and under Triton's interpreter one
Triton kernel per head group (q, k, v); elsewhere PyTorch's ops.
"""
from __future__ import annotations

import torch

from runtime.norm import sum_partials
from runtime.parallel.tensor import claim_main_grad
from runtime.triton_support import tl, triton, use_triton


def split_heads(qkv: torch.Tensor, heads: int, kv_heads: int, d: int):
    """qkv [s, b, (heads + 2 kv_heads) d] -> q, k, v as [b, h, s, d] views."""
    s, b, _ = qkv.shape
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return (q.view(s, b, heads, d).permute(1, 2, 0, 3), k.view(s, b, kv_heads, d).permute(1, 2, 0, 3),
            v.view(s, b, kv_heads, d).permute(1, 2, 0, 3))


if triton is not None:
    @triton.jit
    def _gather_kernel(src_ptr, out_ptr, part_ptr, rows, batch, width, out_width, col0, s_b, s_h, s_s, s_d,
                       D: tl.constexpr, ROWS_PER_PROG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Program (p, j): rows [p * ROWS_PER_PROG, ...) of output columns col0 + [j * BLOCK_N, ...) of one head
        group; out[r, col0 + c] = src[b, h, s, e] with r = s * batch + b, c = h * D + e; writes the column sums
        of its rows into part[p, col0 + c]."""
        p = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = c < width
        col_off = (c // D).to(tl.int64) * s_h + (c % D).to(tl.int64) * s_d
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        start = p.to(tl.int64) * ROWS_PER_PROG
        for m0 in range(0, ROWS_PER_PROG, BLOCK_M):
            r = start + m0 + tl.arange(0, BLOCK_M)
            rmask = r < rows
            row_off = (r // batch) * s_s + (r % batch) * s_b
            mask = rmask[:, None] & cmask[None, :]
            x = tl.load(src_ptr + row_off[:, None] + col_off[None, :], mask=mask, other=0.0)
            tl.store(out_ptr + r[:, None] * out_width + col0 + c[None, :], x, mask=mask)
            acc += tl.sum(x.to(tl.float32), axis=0)
        tl.store(part_ptr + p * out_width + col0 + c, acc, mask=cmask)

_BLOCK = (2, 1024)
_ROWS_PER_PROG = 64
"""As runtime/bias_gelu.py's backward (tuned there on an H200, session 11 call r5)."""


def fused_on(device: torch.device) -> bool:
    """Whether split_heads_with_bias_grad takes the qkv bias's gradient on this device (decided before the qkv
    GEMM runs, so that the linear layer knows whether to sum it itself)."""
    return use_triton(device) and not torch.compiler.is_compiling()


class _SplitHeadsWithBiasGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, bias, heads, kv_heads, d):
        ctx.bias, ctx.shape, ctx.dims = bias, qkv.shape, (heads, kv_heads, d)
        return split_heads(qkv, heads, kv_heads, d)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        s, b, width = ctx.shape
        heads, kv_heads, d = ctx.dims
        like = next(g for g in (dq, dk, dv) if g is not None)
        out = torch.empty(s, b, width, dtype=like.dtype, device=like.device)
        rows = s * b
        progs = triton.cdiv(rows, _ROWS_PER_PROG)
        part = torch.empty(1, progs, width, dtype=torch.float32, device=like.device)
        col0 = 0
        for g, h in ((dq, heads), (dk, kv_heads), (dv, kv_heads)):
            w = h * d
            if g is None:  # no gradient for this group (not used by the loss): zeros
                g = torch.zeros(b, h, s, d, dtype=like.dtype, device=like.device)
            _gather_kernel[(progs, triton.cdiv(w, _BLOCK[1]))](
                g, out, part, rows, b, w, width, col0, g.stride(0), g.stride(1), g.stride(2), g.stride(3), D=d,
                ROWS_PER_PROG=_ROWS_PER_PROG, BLOCK_M=_BLOCK[0], BLOCK_N=_BLOCK[1], num_warps=4)
            col0 += w
        bias = ctx.bias
        target = claim_main_grad(bias)
        if target is None:
            db = torch.empty(width, dtype=bias.dtype, device=like.device)
            sum_partials(part, [db], False)
            return out, db, None, None, None
        main_grad, overwrite = target
        sum_partials(part, [main_grad], not overwrite)
        return out, torch.empty_like(bias), None, None, None


def split_heads_with_bias_grad(qkv: torch.Tensor, bias: torch.Tensor, heads: int, kv_heads: int, d: int):
    """split_heads whose backward also returns the qkv bias's gradient (into its main gradient where it has
    one), for a qkv that the linear layer computed with bias_grad=False; only where fused_on(qkv.device)."""
    assert fused_on(qkv.device) and qkv.is_contiguous() and bias.shape == (qkv.shape[-1],)
    return _SplitHeadsWithBiasGrad.apply(qkv.contiguous(), bias, heads, kv_heads, d)
