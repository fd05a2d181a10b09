"""The attention core: one function, so context parallelism (ring attention) slots in at one place.

q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim] (GQA when kv_heads < heads).
PyTorch's scaled_dot_product_attention picks the fastest exact kernel on the device (flash /
memory-efficient on GPU, math on CPU); GQA goes through `enable_gqa`, so k and v are never expanded.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from planner.model import ModelSpec


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, groups) -> torch.Tensor:
    if groups is not None and groups.cp_size > 1:
        from runtime.parallel.context import ring_attention  # written with context parallelism
        return ring_attention(q, k, v, causal, groups.cp)
    gqa = k.shape[1] != q.shape[1]
    if gqa and q.is_cuda:
        # GQA without expanding k, v needs a fused kernel that takes enable_gqa; never fall back to the
        # math kernel (it would keep the [s, s] probabilities). If none applies, expand k and v instead.
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except RuntimeError:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            gqa = False
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def rotary_inv_freq(spec: ModelSpec, device=None) -> torch.Tensor:
    """The spec's rotary inverse frequencies [head_dim / 2], fp32: pair i turns by rope_theta^(-2i / head_dim) per
    position, then, with Llama 3.1 scaling (spec.rope_scaling_factor), by wavelength 2 pi / f against the original
    context L: f / factor where the wavelength exceeds L / low_freq_factor, f where it is below L / high_freq_factor,
    and in between (1 - a) f / factor + a f with a = (L / wavelength - low) / (high - low), which is 0 and 1 at those
    two bounds: so one clamp of a to [0, 1] gives all three cases. Device arithmetic only (no host copy), so a CUDA
    graph can capture it."""
    d = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    if spec.rope_scaling_factor:
        lo, hi = spec.rope_low_freq_factor, spec.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        a = ((spec.rope_original_max_positions / wavelen - lo) / (hi - lo)).clamp(0.0, 1.0)
        inv_freq = (1 - a) * inv_freq / spec.rope_scaling_factor + a * inv_freq
    return inv_freq


def rotary_tables(positions: torch.Tensor, spec: ModelSpec):
    """cos, sin of shape [seq, head_dim] for the given (global) positions, in fp32, at the spec's frequencies."""
    freqs = positions.float().unsqueeze(-1) * rotary_inv_freq(spec, positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding (Llama / GPT-NeoX convention); x [b, h, s, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos.to(x.dtype) + rotated * sin.to(x.dtype))
