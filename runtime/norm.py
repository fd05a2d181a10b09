"""LayerNorm / RMSNorm fused with the residual add before it: `residual_norm(x, delta) -> (s, y)` with
s = x + delta (the new residual stream; s = x when delta is None) and y = norm(s).

Why: a pre-norm layer adds a branch's output to the residual stream and normalises the sum right away, and
in backward the residual's gradient and the norm's input gradient meet in another add. PyTorch runs that as
an add, a norm, and in backward a norm input-gradient kernel, a separate weight/bias-gradient reduction and a
gradient add: five passes over [tokens, hidden], about 7.8 ms of a 131 ms GPT-1.3B step; torch.compile's
anchor fuses them into two. On CUDA (and under Triton's interpreter) this module does the same: forward is one
Triton kernel (add, statistics, normalise; it writes s, y and the fp32 mean / rstd per row), backward one kernel
that writes ds = norm_backward(dy) + ds_residual and per-program partial sums of the weight and bias gradients
(summed over programs afterwards).

Host time: each call costs about as much host time as PyTorch's own norm kernels. Where the plan allows a
CUDA-graph step (runtime/graph.py) that host time does not reach the GPU; an eager step pays it, and a step
paced by the host (small layers under tensor parallelism) gains nothing from this fusion.

What is kept for backward: s (the norm input, as PyTorch's norms keep their input) and rstd (and LayerNorm's
mean) in fp32. Where Triton does not run (CPU without the interpreter, non-contiguous input, hidden beyond
_MAX_HIDDEN) PyTorch's ops compute the same thing with autograd.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from runtime.parallel.tensor import claim_main_grad
from runtime.triton_support import tl, triton, use_triton

_MAX_HIDDEN = 32768
"""Rows wider than this stay on PyTorch's kernels (a row is held in registers)."""


def residual_norm_eager(x, delta, weight, bias, eps: float, rms: bool, unit_offset: bool = False):
    s = x if delta is None else x + delta
    if rms and unit_offset:  # Gemma: normalised and scaled by (1 + weight) in fp32, then cast back
        return s, (F.rms_norm(s.float(), (s.shape[-1],), None, eps) * (1.0 + weight.float())).to(s.dtype)
    if rms:
        return s, F.rms_norm(s, (s.shape[-1],), weight, eps)
    return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


if triton is not None:
    @triton.jit
    def _fwd_kernel(x_ptr, d_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, n, eps,
                    HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr, RMS: tl.constexpr, UNIT_OFFSET: tl.constexpr,
                    BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        off = row.to(tl.int64) * n + cols
        s = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_DELTA:
            s += tl.load(d_ptr + off, mask=mask, other=0.0).to(tl.float32)
            s = s.to(s_ptr.dtype.element_ty)   # the residual stream is stored, and normalised, rounded
            tl.store(s_ptr + off, s, mask=mask)
            s = s.to(tl.float32)
        if RMS:
            mean = 0.0
            xc = s
        else:
            mean = tl.sum(s, axis=0) / n
            xc = tl.where(mask, s - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:  # Gemma: the scale is (1 + weight)
            w += 1.0
        y = xc * rstd * w
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=mask)
        if not RMS:  # RMSNorm keeps only rstd, as PyTorch's does (the planner's memory model counts one float)
            tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def _bwd_kernel(s_ptr, dy_ptr, ds_res_ptr, w_ptr, mean_ptr, rstd_ptr, ds_ptr, dw_part_ptr, db_part_ptr,
                    rows, n, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, RMS: tl.constexpr,
                    UNIT_OFFSET: tl.constexpr, ROWS_PER_PROG: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:  # the scale is (1 + weight); its gradient is the weight's
            w += 1.0
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        db = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(ROWS_PER_PROG):
            row = pid * ROWS_PER_PROG + i
            if row < rows:
                off = row.to(tl.int64) * n + cols
                s = tl.load(s_ptr + off, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
                if RMS:
                    mean = 0.0
                else:
                    mean = tl.load(mean_ptr + row)
                rstd = tl.load(rstd_ptr + row)
                xhat = tl.where(mask, (s - mean) * rstd, 0.0)
                wdy = w * dy
                c1 = tl.sum(xhat * wdy, axis=0) / n
                if RMS:
                    ds = (wdy - xhat * c1) * rstd
                else:
                    c2 = tl.sum(wdy, axis=0) / n
                    ds = (wdy - (xhat * c1 + c2)) * rstd
                if HAS_RES:
                    ds += tl.load(ds_res_ptr + off, mask=mask, other=0.0).to(tl.float32)
                tl.store(ds_ptr + off, ds.to(ds_ptr.dtype.element_ty), mask=mask)
                dw += dy * xhat
                if HAS_BIAS:
                    db += dy
        tl.store(dw_part_ptr + pid * n + cols, dw, mask=mask)
        if HAS_BIAS:
            tl.store(db_part_ptr + pid * n + cols, db, mask=mask)

    # The partial rows are few and short (4 x SMs rows of hidden fp32): the work is latency, not bandwidth, and
    # which tile hides it best depends on the width (a fixed 128-column tile over 32-row steps takes 122 us per
    # call at 1056 x 2048, 6 ms of a GPT-1.3B step). The tile is tuned once per shape on scratch outputs
    # (sum_partials, in an eager step before any CUDA-graph capture), never on main_grad.
    @triton.jit
    def _sum_partials_kernel(part_ptr, out_ptr, out_stride, n, PARTS: tl.constexpr, ACCUMULATE: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr):
        """out_ptr + a * out_stride (+)= the sum over rows of part[a] ([arrays, parts, n] fp32; grid axis 1 is
        a: the weight's and the bias's partial sums in one launch, their outputs anywhere in one allocation)."""
        a = tl.program_id(1).to(tl.int64)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < n
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        base = part_ptr + a * PARTS * n
        for p0 in range(0, PARTS, BLOCK_P):  # PARTS a constant: a few values per GPU (the backward's programs)
            rows = p0 + tl.arange(0, BLOCK_P)
            m = (rows[:, None] < PARTS) & cmask[None, :]
            acc += tl.sum(tl.load(base + rows[:, None].to(tl.int64) * n + cols[None, :], mask=m, other=0.0), axis=0)
        out = out_ptr + a * out_stride + cols
        if ACCUMULATE:
            acc += tl.load(out, mask=cmask, other=0.0).to(tl.float32)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=cmask)

    # tuned on CUDA; under the interpreter (CPU tests) there is nothing to time: one fixed tile
    _sum_partials_tuned = triton.autotune(
        configs=[triton.Config({"BLOCK_N": bn, "BLOCK_P": bp}, num_warps=w)
                 for bn, bp, w in ((16, 128, 2), (32, 128, 4), (32, 64, 2), (64, 64, 4), (64, 32, 2), (128, 32, 4))],
        key=["PARTS", "n"])(_sum_partials_kernel)

_TUNED: set = set()


def _sum_launch(part, out, stride, parts, n, arrays, accumulate):
    if part.device.type != "cuda":
        _sum_partials_kernel[(triton.cdiv(n, 32), arrays)](part, out, stride, n, PARTS=parts,
                                                           ACCUMULATE=accumulate, BLOCK_N=32, BLOCK_P=64)
        return
    _sum_partials_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), arrays)](
        part, out, stride, n, PARTS=parts, ACCUMULATE=accumulate)


def sum_partials(part: torch.Tensor, outs: list[torch.Tensor], accumulate: bool) -> None:
    """outs[a] (+)= part[a].sum(0) for the weight (and bias) partial sums, in one launch when the outputs share
    an allocation (a norm's main_grad views in the flat gradient buffer, or one new [2, n] tensor). Also used by
    runtime/bias_gelu.py for its bias gradient."""
    arrays, parts, n = part.shape
    key = (parts, n, part.device)
    if key not in _TUNED:  # autotune on scratch outputs: its trials would add to main_grad several times
        _sum_launch(part, torch.empty(arrays, n, dtype=torch.float32, device=part.device), n, parts, n, arrays, False)
        _TUNED.add(key)
    one = arrays == 1 or (outs[1].untyped_storage().data_ptr() == outs[0].untyped_storage().data_ptr()
                          and outs[1].dtype == outs[0].dtype)
    if one:
        stride = (outs[-1].data_ptr() - outs[0].data_ptr()) // outs[0].element_size()
        _sum_launch(part, outs[0], stride, parts, n, arrays, accumulate)
        return
    for a in range(arrays):
        _sum_launch(part[a], outs[a], 0, parts, n, 1, accumulate)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _warps(block: int) -> int:
    return min(16, max(4, block // 256))


def _bwd_programs(rows: int, device: torch.device) -> int:
    """Backward programs: four per SM (with 8-16 warps each, enough in flight to hide memory latency), each
    taking a contiguous run of rows and writing one partial row of the weight / bias gradients (528 x 2048
    fp32 = 4.3 MiB at hidden 2048, summed by one more kernel)."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 2
    return max(1, min(rows, 4 * sms))


def _main_grads(weight: torch.Tensor, bias: torch.Tensor | None):
    """(weight's, bias's fp32 `main_grad` views, accumulate?) when the optimizer gave them (all of them) one,
    else None; claimed as runtime/parallel/tensor.py's claim_main_grad says."""
    params = [weight] + ([bias] if bias is not None else [])
    if any(getattr(p, "main_grad", None) is None for p in params):
        return None
    claims = [claim_main_grad(p) for p in params]
    return claims[0][0], (claims[1][0] if bias is not None else None), not claims[0][1]


class _ResidualNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, delta, weight, bias, eps, rms, unit_offset):
        n = x.shape[-1]
        rows = x.numel() // n
        s = torch.empty_like(x) if delta is not None else x
        y = torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        mean = rstd if rms else torch.empty(rows, dtype=torch.float32, device=x.device)  # RMS: not written
        block = triton.next_power_of_2(n)
        _fwd_kernel[(rows,)](x, delta if delta is not None else x, weight, bias if bias is not None else weight,
                             s, y, mean, rstd, n, eps, HAS_DELTA=delta is not None, HAS_BIAS=bias is not None,
                             RMS=rms, UNIT_OFFSET=unit_offset, BLOCK=block, num_warps=_warps(block))
        ctx.save_for_backward(s, weight, mean, rstd)
        ctx.weight_param, ctx.bias_param = weight, bias  # the Parameters themselves (their main_grad views)
        ctx.has_delta, ctx.has_bias, ctx.rms, ctx.unit_offset = delta is not None, bias is not None, rms, unit_offset
        # s is x itself without delta: autograd hands back a view of x as the first output
        return s, y

    @staticmethod
    def backward(ctx, ds_res, dy):
        s, weight, mean, rstd = ctx.saved_tensors
        n = s.shape[-1]
        rows = s.numel() // n
        if dy is None:  # only the residual was used: the norm contributes nothing
            dy = torch.zeros_like(s)
        dy = dy.contiguous()
        if ds_res is not None:
            ds_res = ds_res.contiguous()
        block = triton.next_power_of_2(n)
        progs = _bwd_programs(rows, s.device)
        ds = torch.empty_like(s)
        arrays = 2 if ctx.has_bias else 1
        part = torch.empty(arrays, progs, n, dtype=torch.float32, device=s.device)
        _bwd_kernel[(progs,)](s, dy, ds_res if ds_res is not None else dy, weight, mean, rstd, ds, part[0],
                              part[-1], rows, n, HAS_RES=ds_res is not None, HAS_BIAS=ctx.has_bias, RMS=ctx.rms,
                              UNIT_OFFSET=ctx.unit_offset, ROWS_PER_PROG=triton.cdiv(rows, progs), BLOCK=block,
                              num_warps=_warps(block))
        # weight and bias gradients: straight into their fp32 main_grad where they have one (no bf16 gradient,
        # no separate add by the optimizer's hook), else into new tensors
        targets = _main_grads(ctx.weight_param, ctx.bias_param)
        if targets is not None:
            outs, accumulate = [t for t in targets[:arrays]], targets[2]
        else:
            outs, accumulate = list(torch.empty(arrays, n, dtype=weight.dtype, device=s.device)), False
        sum_partials(part, outs, accumulate)
        if targets is not None:  # placeholders: the optimizer's hooks find the gradients in main_grad
            return ds, (ds if ctx.has_delta else None), torch.empty_like(weight), \
                (torch.empty_like(ctx.bias_param) if ctx.has_bias else None), None, None, None
        return ds, (ds if ctx.has_delta else None), outs[0], (outs[1] if ctx.has_bias else None), None, None, None


def _fused(x: torch.Tensor, delta, weight) -> bool:
    # under torch.compile (`--compile`) the plain ops are left to Inductor, which fuses the add and the norm
    # itself, rather than tracing this function's Triton launches and main_grad side effects
    return (use_triton(x.device) and not torch.compiler.is_compiling() and x.is_contiguous() and x.numel() > 0 and x.shape[-1] <= _MAX_HIDDEN
            and (delta is None or (delta.is_contiguous() and delta.shape == x.shape and delta.dtype == x.dtype))
            and weight.is_contiguous())


def residual_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                  eps: float, rms: bool, unit_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, y): s = x + delta (x when delta is None), y = LayerNorm(s) (RMSNorm when rms, no bias) over the
    last dimension; unit_offset (RMSNorm only): scaled by (1 + weight) in fp32 (Gemma). Backward merges the
    gradient arriving at s with the norm's input gradient in one pass."""
    if not _fused(x, delta, weight):
        return residual_norm_eager(x, delta, weight, bias, eps, rms, unit_offset)
    return _ResidualNorm.apply(x, delta, weight, bias, eps, rms, unit_offset)


@torch.no_grad()
def norm_forward(s: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                 rms: bool, unit_offset: bool = False) -> torch.Tensor:
    """y = norm(s) without autograd (selective recompute rebuilds the norm output from its input)."""
    return residual_norm(s, None, weight, bias, eps, rms, unit_offset)[1]
