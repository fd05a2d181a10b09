"""gelu_tanh(y + b): the GPT / BERT MLP's bias add and activation as one autograd function (Megatron's
bias-GELU fusion), whose backward also gives the bias gradient.

The fc1 GEMM runs without its bias (ColumnParallelLinear.skip_bias_add); this function adds it. Forward keeps
y (the GEMM output, what the plain GELU kept). Backward computes dy = gelu'(y + b) * g and, in the same pass,
per-program column partial sums of dy; one small kernel (runtime/norm.py's sum_partials) adds them up straight
into the bias's main gradient where the optimizer gave it one (tensor.claim_main_grad's protocol), else into a
new tensor. Why: unfused, the bias gradient is a separate reduction over dY [tokens, ffn] right after GELU's
backward has written it: 24 x 50 us of a GPT-1.3B step (3.7 ms in the four bias sums of each layer, fc1's the
largest).

On CUDA (and under Triton's interpreter) one Triton kernel each way; elsewhere PyTorch's ops.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.norm import sum_partials
from runtime.parallel.tensor import claim_main_grad, store_main_grad
from runtime.triton_support import tl, triton, use_triton

_SQRT_2_OVER_PI = 0.7978845608028654
_COEF = 0.044715


def bias_gelu_eager(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(y + bias, approximate="tanh")


if triton is not None:
    @triton.jit
    def _gelu_tanh(z):
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        e = tl.exp(-2.0 * tl.abs(inner))  # tanh via exp of a non-positive number: no overflow
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(inner >= 0, t, -t)
        return 0.5 * z * (1.0 + t), t

    @triton.jit
    def _fwd_kernel(y_ptr, b_ptr, out_ptr, rows, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (r[:, None] < rows) & (c[None, :] < n)
        off = r[:, None] * n + c[None, :]
        z = tl.load(y_ptr + off, mask=mask, other=0.0).to(tl.float32) \
            + tl.load(b_ptr + c, mask=c < n, other=0.0).to(tl.float32)[None, :]
        out, _ = _gelu_tanh(z)
        tl.store(out_ptr + off, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _bwd_kernel(y_ptr, b_ptr, g_ptr, dy_ptr, part_ptr, rows, n, ROWS_PER_PROG: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Program (p, j): rows [p * ROWS_PER_PROG, ...) of columns block j; writes dy there and its column sums
        into part[p, columns]."""
        p = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = c < n
        bias = tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        start = p.to(tl.int64) * ROWS_PER_PROG
        for m0 in range(0, ROWS_PER_PROG, BLOCK_M):
            r = start + m0 + tl.arange(0, BLOCK_M)
            mask = (r[:, None] < rows) & cmask[None, :]
            off = r[:, None] * n + c[None, :]
            z = tl.load(y_ptr + off, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
            g = tl.load(g_ptr + off, mask=mask, other=0.0).to(tl.float32)
            _, t = _gelu_tanh(z)
            dinner = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * z * z)
            d = g * (0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * dinner)
            d = tl.where(mask, d, 0.0)
            tl.store(dy_ptr + off, d.to(dy_ptr.dtype.element_ty), mask=mask)
            acc += tl.sum(d, axis=0)
        tl.store(part_ptr + p * n + c, acc, mask=cmask)

_FWD_BLOCK = (16, 256)
_BWD_BLOCK = (2, 1024)
_BWD_ROWS_PER_PROG = 64
_BWD_WARPS = 4
"""Backward tiles: 2 rows x 1024 columns, 64 rows per program, 4 warps, the fastest of 40 shapes x rows per program
x warps timed: 155 us at 8192 x 8192 (GPT-1.3B's fc1 at micro-batch 4) and 279 us at 32768 x 4096, partial sums
included, against 185 / 338 us for PyTorch's GELU backward plus the column sum, and 265 / 516 us for 16 x 256
tiles over 256 rows. 8192 rows make a
128-row partial-sum table (4 MiB fp32)."""


def _fused(y: torch.Tensor, bias: torch.Tensor) -> bool:
    return (use_triton(y.device) and not torch.compiler.is_compiling() and y.is_contiguous() and y.numel() > 0
            and bias.is_contiguous() and bias.shape == (y.shape[-1],))


@torch.no_grad()
def bias_gelu_forward(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(y + bias) without autograd (what selective recompute rebuilds in fc2's backward)."""
    if not _fused(y, bias):
        return bias_gelu_eager(y, bias)
    n = y.shape[-1]
    rows = y.numel() // n
    out = torch.empty_like(y)
    _fwd_kernel[(triton.cdiv(rows, _FWD_BLOCK[0]), triton.cdiv(n, _FWD_BLOCK[1]))](
        y, bias, out, rows, n, BLOCK_M=_FWD_BLOCK[0], BLOCK_N=_FWD_BLOCK[1])
    return out


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, bias):
        ctx.save_for_backward(y)
        ctx.bias = bias  # the Parameter itself (its main_grad view), as runtime/norm.py keeps its weights
        return bias_gelu_forward(y, bias)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        bias = ctx.bias
        g = g.contiguous()
        if not _fused(y, bias):
            with torch.enable_grad():
                yy, bb = y.detach().requires_grad_(True), bias.detach().requires_grad_(True)
                dy, db = torch.autograd.grad(bias_gelu_eager(yy, bb), (yy, bb), g)
            target = claim_main_grad(bias)
            if target is None:
                return dy, db
            main_grad, overwrite = target
            store_main_grad(main_grad, db, overwrite)
            return dy, torch.empty_like(bias)
        n = y.shape[-1]
        rows = y.numel() // n
        progs = triton.cdiv(rows, _BWD_ROWS_PER_PROG)
        dy = torch.empty_like(y)
        part = torch.empty(1, progs, n, dtype=torch.float32, device=y.device)
        _bwd_kernel[(progs, triton.cdiv(n, _BWD_BLOCK[1]))](
            y, bias, g, dy, part, rows, n, ROWS_PER_PROG=_BWD_ROWS_PER_PROG, BLOCK_M=_BWD_BLOCK[0],
            BLOCK_N=_BWD_BLOCK[1], num_warps=_BWD_WARPS)
        target = claim_main_grad(bias)
        if target is None:
            db = torch.empty(n, dtype=bias.dtype, device=y.device)
            sum_partials(part, [db], False)
            return dy, db
        main_grad, overwrite = target
        sum_partials(part, [main_grad], not overwrite)
        return dy, torch.empty_like(bias)  # a placeholder: the optimizer's hook finds the gradient in main_grad


def bias_gelu(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(y + bias); backward gives y's gradient and bias's (into its main gradient where it has one)."""
    return _BiasGelu.apply(y, bias)
