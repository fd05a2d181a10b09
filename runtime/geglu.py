"""GeGLU, gelu(gate) * up (Gemma's MLP), as one autograd function that keeps only its input [..., 2f] (gate, then
up), as runtime/swiglu.py keeps SwiGLU's, so that the planner's memory model of a gated MLP (its 2f input and the f
output that the down projection keeps) holds for both.

PyTorch's ops compute it on every device (there is no Triton kernel for it): the forward as Hugging Face's GemmaMLP
does, F.gelu of the gate in the activation's dtype times up; the backward recomputes the GELU in fp32, in row chunks
so that its fp32 temporaries stay bounded, and writes the gradient in x's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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


class GeGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return geglu_eager(x, approximate)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return geglu_backward(x, g.contiguous(), ctx.approximate), None


def geglu(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """gelu(gate) * up for x = [..., gate | up] ('tanh': GELU's tanh approximation, Gemma's; 'none': exact erf);
    backward keeps only x."""
    return GeGLUFunction.apply(x, approximate)
