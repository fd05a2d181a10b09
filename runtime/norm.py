"""LayerNorm and RMSNorm over the last dimension, forward and backward as Triton kernels on CUDA.

Why not torch's kernels: on H200 (2026-11-30, GPT 1.3B, [8192, 2048] bf16) torch's LayerNorm backward ran
as two kernels (the input gradient, then a separate weight/bias-gradient reduction) taking 6 ms of a
131 ms step for 49 calls, several times the time of its memory traffic. Here one kernel per block of rows
writes the input gradient and that block's partial weight/bias gradients (fp32), and a sum over the
blocks finishes them (the Triton tutorial's layer-norm scheme, without its locks).

Saved for backward, as torch's kernels: the input and the fp32 mean (LayerNorm only) and 1/std per row.
Off CUDA (CPU runs and tests) torch's F.layer_norm / F.rms_norm run; under Triton's interpreter
(TRITON_INTERPRET=1) the kernels run on CPU tensors, which is how the tests check them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.parallel.cross_entropy import triton, use_triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _norm_fwd_kernel(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, n_cols, eps, RMS: tl.constexpr,
                         HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            xc = x
        else:
            mean = tl.sum(x, 0) / n_cols
            xc = tl.where(mask, x - mean, 0.0)
            tl.store(mean_ptr + row, mean)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 0) / n_cols + eps)
        tl.store(rstd_ptr + row, rstd)
        y = xc * rstd * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _norm_bwd_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, mean_ptr, rstd_ptr, dw_part_ptr, db_part_ptr, n_rows, n_cols,
                         ROWS: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        """Rows [pid * ROWS, (pid + 1) * ROWS): their input gradients and this block's partial dw (and db)."""
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK,), tl.float32)
        db = tl.zeros((BLOCK,), tl.float32)
        for i in range(ROWS):
            row = (pid * ROWS + i).to(tl.int64)
            if row < n_rows:
                x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                rstd = tl.load(rstd_ptr + row)
                if RMS:
                    xhat = x * rstd
                else:
                    xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
                wdy = w * dy
                c1 = tl.sum(xhat * wdy, 0) / n_cols
                if RMS:
                    dx = (wdy - xhat * c1) * rstd
                else:
                    c2 = tl.sum(wdy, 0) / n_cols
                    dx = (wdy - (xhat * c1 + c2)) * rstd
                tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                dw += dy * xhat
                if HAS_BIAS:
                    db += dy
        tl.store(dw_part_ptr + pid * n_cols + cols, dw, mask=mask)
        if HAS_BIAS:
            tl.store(db_part_ptr + pid * n_cols + cols, db, mask=mask)


_ROWS_PER_PROGRAM = 64
_MAX_FUSED_COLS = 16384


def _launch_shape(n_cols: int):
    block = triton.next_power_of_2(n_cols)
    return block, min(max(block // 256, 1), 16)


class _FusedNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        n_rows, n_cols = x2.shape
        y = torch.empty_like(x2)
        mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        block, warps = _launch_shape(n_cols)
        _norm_fwd_kernel[(n_rows,)](x2, y, weight, bias if bias is not None else weight, mean, rstd, n_cols, eps,
                                    RMS=rms, HAS_BIAS=bias is not None, BLOCK=block, num_warps=warps)
        if rms:
            ctx.save_for_backward(x2, weight, rstd)
        else:
            ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.rms, ctx.has_bias, ctx.shape = rms, bias is not None, shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        if ctx.rms:
            x2, weight, rstd = ctx.saved_tensors
            mean = rstd  # unused by the RMS kernel
        else:
            x2, weight, mean, rstd = ctx.saved_tensors
        n_rows, n_cols = x2.shape
        dy2 = dy.reshape(n_rows, n_cols).contiguous()
        dx = torch.empty_like(x2)
        programs = triton.cdiv(n_rows, _ROWS_PER_PROGRAM)
        dw_part = torch.empty((programs, n_cols), dtype=torch.float32, device=x2.device)
        db_part = torch.empty_like(dw_part) if ctx.has_bias else dw_part
        block, warps = _launch_shape(n_cols)
        _norm_bwd_kernel[(programs,)](x2, dy2, dx, weight, mean, rstd, dw_part, db_part, n_rows, n_cols,
                                      ROWS=_ROWS_PER_PROGRAM, RMS=ctx.rms, HAS_BIAS=ctx.has_bias, BLOCK=block,
                                      num_warps=warps)
        dw = dw_part.sum(0).to(weight.dtype)
        db = db_part.sum(0).to(weight.dtype) if ctx.has_bias else None
        return dx.view(ctx.shape), dw, db, None, None


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, rms: bool,
         fused: bool | None = None) -> torch.Tensor:
    """LayerNorm (rms=False, optional bias) or RMSNorm (rms=True) of x over its last dimension."""
    if fused is None:
        fused = use_triton(x.device) and x.shape[-1] <= _MAX_FUSED_COLS
    if fused:
        return _FusedNorm.apply(x, weight, bias, eps, rms)
    if rms:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
