"""GeGLU, gelu(gate) * up (Gemma's MLP), as one autograd function that keeps only its input [..., 2f] (gate, then
up), as runtime/swiglu.py keeps SwiGLU's, so that the planner's memory model of a gated MLP (its 2f input and the f
output that the down projection keeps) holds for both.

On CUDA (and under Triton's interpreter) forward and backward are one Triton kernel each, as SwiGLU's: every element
read once and written once, in fp32 registers, GELU in either form (tanh approximation or exact erf). Elsewhere
PyTorch's ops compute it: the forward as Hugging Face's GemmaMLP does, F.gelu of the gate in the activation's dtype
times up; the backward recomputes the GELU in fp32, in row chunks so that its fp32 temporaries stay bounded, and
writes the gradient in x's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.swiglu import _BLOCK, _grid  # the same [..., gate | up] rows, one program per row and block
from runtime.triton_support import tl, triton, use_triton

_CHUNK_ELEMS = 1 << 24
"""Backward: rows per chunk so that one fp32 temporary stays within this many elements (64 MiB)."""


def geglu_eager(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """gelu(gate) * up for x = [..., gate | up], GELU in the form torch's F.gelu(approximate=...) names."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


def geglu_backward(x: torch.Tensor, g: torch.Tensor, approximate: str) -> torch.Tensor:
    """d(gelu(gate) * up)/d(gate, up) times g, in fp32, written into one tensor of x's dtype, chunk by chunk."""
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    dx = torch.empty_like(x2)
    f = x2.shape[-1] // 2
    rows = max(1, _CHUNK_ELEMS // max(x2.shape[-1], 1))
    for r in range(0, x2.shape[0], rows):
        gate, up = x2[r:r + rows].float().chunk(2, dim=-1)
        gg = g2[r:r + rows].float()
        with torch.enable_grad():
            leaf = gate.detach().requires_grad_(True)
            act = F.gelu(leaf, approximate=approximate)
            (d_gate,) = torch.autograd.grad(act, leaf, gg * up)
        dx[r:r + rows, :f] = d_gate
        dx[r:r + rows, f:] = gg * act.detach()
    return dx.view_as(x)


if triton is not None:
    @triton.jit
    def _gelu_and_slope(z, EXACT: tl.constexpr):
        """(gelu(z), gelu'(z)) in fp32: the exact erf form, or the tanh approximation (tanh through the exp of a
        non-positive number: no overflow; 1 - tanh^2 as 4e / (1 + e)^2, which keeps its precision where tanh nears 1
        and 1 - t * t would cancel)."""
        if EXACT:
            cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
            return z * cdf, cdf + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        e = tl.exp(-2.0 * tl.abs(inner))
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(inner >= 0, t, -t)
        sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e))
        slope = 0.5 * (1.0 + t) + 0.5 * z * sech2 * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * z * z)
        return 0.5 * z * (1.0 + t), slope

    @triton.jit
    def _geglu_fwd_kernel(x_ptr, y_ptr, f, EXACT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < f
        gate = tl.load(x_ptr + row * 2 * f + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * f + f + cols, mask=mask, other=0.0).to(tl.float32)
        act, _ = _gelu_and_slope(gate, EXACT)
        tl.store(y_ptr + row * f + cols, (act * up).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _geglu_bwd_kernel(x_ptr, g_ptr, dx_ptr, f, EXACT: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < f
        gate = tl.load(x_ptr + row * 2 * f + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * f + f + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * f + cols, mask=mask, other=0.0).to(tl.float32)
        act, slope = _gelu_and_slope(gate, EXACT)
        tl.store(dx_ptr + row * 2 * f + cols, (g * up * slope).to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + row * 2 * f + f + cols, (g * act).to(dx_ptr.dtype.element_ty), mask=mask)

def _fused(x: torch.Tensor) -> bool:
    return (use_triton(x.device) and not torch.compiler.is_compiling() and x.is_contiguous() and x.numel() > 0
            and x.shape[-1] % 2 == 0)


class GeGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        if not _fused(x):
            return geglu_eager(x, approximate)
        grid, f = _grid(x)
        y = x.new_empty(*x.shape[:-1], f)
        _geglu_fwd_kernel[grid](x, y, f, EXACT=approximate == "none", BLOCK=_BLOCK)
        return y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        g = g.contiguous()
        if not _fused(x):
            return geglu_backward(x, g, ctx.approximate), None
        grid, f = _grid(x)
        dx = torch.empty_like(x)
        _geglu_bwd_kernel[grid](x, g, dx, f, EXACT=ctx.approximate == "none", BLOCK=_BLOCK)
        return dx, None


def geglu(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """gelu(gate) * up for x = [..., gate | up] ('tanh': GELU's tanh approximation, Gemma's; 'none': exact erf);
    backward keeps only x."""
    return GeGLUFunction.apply(x, approximate)
