"""Qwen3's per-head q/k RMSNorm in one Triton kernel each way, in the qkv GEMM output's own layout:
`qk_norm(qkv, q_weight, k_weight, heads, kv_heads, eps) -> qkv'` where every head of q is RMS-normalised over
head_dim and scaled by q_weight, every head of k likewise by k_weight, and v is copied unchanged.

Why: PyTorch's RMSNorm over [s, b, heads, head_dim] views of the qkv output copies the strided views to
contiguous memory, runs a layer-norm kernel over 128-wide rows at about a quarter of its rate on hidden-wide rows,
and needs a concatenation to put q and k back beside v for the fused rotary: about 51 ms of a 0.79 s
qwen3-8b-8l step at micro-batch 1, where the cost model prices 10 ms.
Here the qkv output is read once and the normalised qkv written once; backward reads it, its gradient and the
per-head rstd, writes the input gradient and per-program partial sums of the two weights' gradients (summed by
runtime/norm.py's sum_partials, straight into their fp32 main_grad where the optimizer gave one).

The rows are the qkv output viewed as [tokens x (heads + 2 kv_heads), head_dim]: row r is head r % (heads +
2 kv_heads) of token r // (heads + 2 kv_heads), q heads first, then k, then v (the column-parallel layout). What is
kept for backward: the qkv output itself and an fp32 rstd per q and k head and token, as planner/memory/activations.py counts.
"""
from __future__ import annotations

import torch

from runtime.norm import _main_grads, _sm_count, sum_partials
from runtime.triton_support import tl, triton, use_triton

_ROWS_PER_BLOCK = 16
"""Head rows per forward program (16 x 128 elements: 4 warps)."""

BWD_ROWS_PER_BLOCK = 64
"""Head rows per step of a backward program. 64 rows, 8 programs per SM and 4 warps is the fastest of
benchmarks/tune_qk_norm.py's 18 choices at Qwen3-8B's shape (4096 tokens, head dimension 128): 178 us against
282 us for 16 / 4 / 4 (benchmarks/results/tune-qk-norm/)."""

BWD_PROGRAMS_PER_SM = 8
"""Backward programs per SM, each a contiguous run of row blocks (and one partial row of each weight gradient)."""

BWD_WARPS = 4
"""Warps per backward program (a [BWD_ROWS_PER_BLOCK, head_dim] tile each step)."""

if triton is not None:
    @triton.jit
    def _qk_norm_fwd_kernel(x_ptr, wq_ptr, wk_ptr, y_ptr, rstd_ptr, rows, eps, HQ: tl.constexpr, HK: tl.constexpr,
                    HALL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_D)
        rmask, cmask = r < rows, cols < D
        m = rmask[:, None] & cmask[None, :]
        off = r.to(tl.int64)[:, None] * D + cols[None, :]
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        head = r % HALL
        is_q = head < HQ
        is_k = (head >= HQ) & (head < HQ + HK)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        wq = tl.load(wq_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        wk = tl.load(wk_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        w = tl.where(is_q[:, None], wq[None, :], wk[None, :])
        y = tl.where((is_q | is_k)[:, None], x * rstd[:, None] * w, x)
        tl.store(y_ptr + off, y.to(y_ptr.dtype.element_ty), mask=m)
        tok = (r // HALL).to(tl.int64)
        tl.store(rstd_ptr + tok * (HQ + HK) + head, rstd, mask=rmask & (is_q | is_k))

    @triton.jit
    def _qk_norm_bwd_kernel(x_ptr, dy_ptr, wq_ptr, wk_ptr, rstd_ptr, dx_ptr, dwq_ptr, dwk_ptr, rows,
                    HQ: tl.constexpr, HK: tl.constexpr, HALL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCKS_PER_PROG: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_D)
        cmask = cols < D
        wq = tl.load(wq_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        wk = tl.load(wk_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        dwq = tl.zeros([BLOCK_D], dtype=tl.float32)
        dwk = tl.zeros([BLOCK_D], dtype=tl.float32)
        for i in range(BLOCKS_PER_PROG):
            r = (pid * BLOCKS_PER_PROG + i) * BLOCK_R + tl.arange(0, BLOCK_R)
            rmask = r < rows
            m = rmask[:, None] & cmask[None, :]
            off = r.to(tl.int64)[:, None] * D + cols[None, :]
            x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
            head = r % HALL
            is_q = head < HQ
            is_k = (head >= HQ) & (head < HQ + HK)
            normed = is_q | is_k
            tok = (r // HALL).to(tl.int64)
            rstd = tl.load(rstd_ptr + tok * (HQ + HK) + head, mask=rmask & normed, other=0.0)
            xhat = x * rstd[:, None]                     # 0 on v rows and masked rows
            wdy = tl.where(is_q[:, None], wq[None, :], wk[None, :]) * dy
            c1 = tl.sum(xhat * wdy, axis=1) / D
            dx = tl.where(normed[:, None], (wdy - xhat * c1[:, None]) * rstd[:, None], dy)
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)
            g = dy * xhat
            dwq += tl.sum(tl.where(is_q[:, None], g, 0.0), axis=0)
            dwk += tl.sum(tl.where(is_k[:, None], g, 0.0), axis=0)
        tl.store(dwq_ptr + pid * D + cols, dwq, mask=cmask)
        tl.store(dwk_ptr + pid * D + cols, dwk, mask=cmask)


def _bwd_grid(blocks: int, device: torch.device) -> tuple[int, int]:
    """(programs, blocks per program): BWD_PROGRAMS_PER_SM per SM, each a contiguous run of row blocks."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 2
    per_prog = triton.cdiv(blocks, max(1, min(blocks, BWD_PROGRAMS_PER_SM * sms)))
    return triton.cdiv(blocks, per_prog), per_prog


class _QkNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, q_weight, k_weight, heads, kv_heads, eps):
        d = q_weight.numel()
        hall = heads + 2 * kv_heads
        rows = qkv.numel() // d
        y = torch.empty_like(qkv)
        rstd = torch.empty(rows // hall * (heads + kv_heads), dtype=torch.float32, device=qkv.device)
        _qk_norm_fwd_kernel[(triton.cdiv(rows, _ROWS_PER_BLOCK),)](
            qkv, q_weight, k_weight, y, rstd, rows, eps, HQ=heads, HK=kv_heads, HALL=hall, D=d,
            BLOCK_D=triton.next_power_of_2(d), BLOCK_R=_ROWS_PER_BLOCK)
        ctx.save_for_backward(qkv, q_weight, k_weight, rstd)
        ctx.params, ctx.heads, ctx.kv_heads = (q_weight, k_weight), heads, kv_heads
        return y

    @staticmethod
    def backward(ctx, dy):
        qkv, q_weight, k_weight, rstd = ctx.saved_tensors
        d = q_weight.numel()
        hall = ctx.heads + 2 * ctx.kv_heads
        rows = qkv.numel() // d
        dy = dy.contiguous()
        dx = torch.empty_like(qkv)
        programs, per_prog = _bwd_grid(triton.cdiv(rows, BWD_ROWS_PER_BLOCK), qkv.device)
        part = torch.empty(2, programs, d, dtype=torch.float32, device=qkv.device)
        _qk_norm_bwd_kernel[(programs,)](qkv, dy, q_weight, k_weight, rstd, dx, part[0], part[1], rows, HQ=ctx.heads,
                                 HK=ctx.kv_heads, HALL=hall, D=d, BLOCK_D=triton.next_power_of_2(d),
                                 BLOCK_R=BWD_ROWS_PER_BLOCK, BLOCKS_PER_PROG=per_prog, num_warps=BWD_WARPS)
        # the two weights' gradients straight into their main_grad where the optimizer gave them one (the
        # protocol of runtime/norm.py), else new tensors
        targets = _main_grads(*ctx.params)
        if targets is not None:
            sum_partials(part, [targets[0], targets[1]], targets[2])
            return dx, torch.empty_like(q_weight), torch.empty_like(k_weight), None, None, None
        outs = list(torch.empty(2, d, dtype=q_weight.dtype, device=qkv.device))
        sum_partials(part, outs, False)
        return dx, outs[0], outs[1], None, None, None


def fused(qkv: torch.Tensor) -> bool:
    """Whether qk_norm runs the Triton kernels (CUDA, or Triton's interpreter on CPU) rather than PyTorch's ops.
    Under torch.compile the plain ops are left to Inductor, as runtime/norm.py does."""
    return use_triton(qkv.device) and not torch.compiler.is_compiling() and qkv.is_contiguous() and qkv.numel() > 0


def qk_norm(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, heads: int, kv_heads: int,
            eps: float) -> torch.Tensor:
    """qkv [..., (heads + 2 kv_heads) head_dim] -> the same layout with q's and k's heads RMS-normalised (the
    caller checks `fused` first; runtime/model.py's Attention.qk_normalize holds the PyTorch path)."""
    return _QkNorm.apply(qkv, q_weight, k_weight, heads, kv_heads, eps)
