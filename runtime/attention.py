"""The attention core: one function, so context parallelism (ring attention) slots in at one place.

q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim] (GQA when kv_heads < heads).
PyTorch's scaled_dot_product_attention picks the fastest exact kernel on the device (flash /
memory-efficient on GPU, math on CPU); GQA goes through `enable_gqa`, so k and v are never expanded.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


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


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float = 10000.0):
    """cos, sin of shape [seq, head_dim] for the given (global) positions, in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding (Llama / GPT-NeoX convention); x [b, h, s, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos.to(x.dtype) + rotated * sin.to(x.dtype))
