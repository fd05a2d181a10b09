"""The experts of an MoE layer (runtime/parallel/expert.py): one routed expert (`Expert`), the shared experts
(`SharedExperts`), and the two ways to run a rank's local experts on rows grouped by expert: one module after
the other (`looped_experts`) or each projection as one grouped GEMM over all of them (`grouped_experts`,
torch._grouped_mm with the per-expert row counts as offsets on the device), where `grouped_mm_supported`.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.model import ModelSpec
from runtime import grouped_wgrad
from runtime.parallel.tensor import claim_main_grad, store_main_grad
from runtime.swiglu import swiglu


class Expert(nn.Module):
    """One expert: SwiGLU (w_gate, w_up: [ffn, hidden], w_down: [hidden, ffn], no bias) for gated specs,
    else GELU (in the spec's gelu_approximate form) with biases when the spec has them. Weights in nn.Linear's
    [out, in] layout."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        H, Fh = spec.hidden, spec.ffn_hidden
        out_std = 0.02 / math.sqrt(2 * spec.num_layers)  # as the dense MLP's output projection
        self.gated, self.approximate = spec.gated_mlp, spec.gelu_approximate
        self.w_gate = expert_param((Fh, H), ("normal", 0.02)) if self.gated else None
        self.w_up = expert_param((Fh, H), ("normal", 0.02))
        self.w_down = expert_param((H, Fh), ("normal", out_std))
        bias = spec.has_bias and not self.gated
        self.b_up = expert_param((Fh,), ("zeros",)) if bias else None
        self.b_down = expert_param((H,), ("zeros",)) if bias else None

    def forward(self, x):
        if self.gated:  # one [gate | up] tensor through runtime/swiglu.py, as the grouped path keeps it
            return F.linear(swiglu(torch.cat([F.linear(x, self.w_gate), F.linear(x, self.w_up)], -1)), self.w_down)
        return F.linear(F.gelu(F.linear(x, self.w_up, self.b_up), approximate=self.approximate), self.w_down,
                        self.b_down)


def grouped_mm_supported(x: torch.Tensor, *dims: int) -> bool:
    """Whether experts with these weight dimensions can run as grouped GEMMs on x's device and dtype: CUDA
    bf16 on Hopper (sm 9.x), where torch._grouped_mm is one CUTLASS kernel, with every row 16-byte aligned
    (each dim a multiple of 8), as the kernel requires. Not on Blackwell until checked there: pytorch#172439
    reports non-zero weight gradients for empty groups on sm 10.0. torch runs it on CPU too (fp32, bf16,
    fp16): tests force the grouped path there."""
    return (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and _sm_major(x.device.index) == 9 and all(d % 8 == 0 for d in dims))


@functools.lru_cache(maxsize=None)
def _sm_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


class _GroupedLinear(torch.autograd.Function):
    """y[rows of group g] = x[rows of group g] @ W_g^T, group g owning rows offs[g-1]:offs[g], W_g the
    concatenation along the output dimension of `per_group` consecutive tensors of `weights` (all [out, in],
    nn.Linear's layout). The kernels take the weights as one [G, N, K] tensor: a view where they lie back to back
    (the optimizer's flat buffer lays each projection's expert weights out so), else a stacked copy, made again
    in backward rather than saved. The weight gradient, one [G, N, K] tensor, goes to the weights' main
    gradients in one pass where the optimizer gave them some (tensor.claim_main_grad's protocol), else each
    weight gets its slice."""

    @staticmethod
    def forward(ctx, x, offs, per_group, placeholders, *weights):
        ctx.per_group, ctx.placeholders = per_group, placeholders
        # the Parameters themselves: under activation checkpointing the saved copies lack main_grad, and the
        # weight gradient would fall back to a separate GEMM and an fp32 add per expert weight (14% of a
        # full-recompute MoE step's time in those adds)
        ctx.params = weights
        ctx.save_for_backward(x, offs, *weights)
        return torch._grouped_mm(x, _stack(weights, per_group).transpose(1, 2), offs=offs)

    @staticmethod
    def backward(ctx, dy):
        x, offs, *weights = ctx.saved_tensors
        dy = dy.contiguous()  # the kernels reject stride-0 (expanded) gradients
        w = _stack(weights, ctx.per_group)                                   # [G, N, K]
        dx = torch._grouped_mm(dy, w, offs=offs)
        claims = [claim_main_grad(p) for p in ctx.params] if all(
            getattr(p, "main_grad", None) is not None for p in ctx.params) else None
        stacked = None
        if claims is not None and len({overwrite for _, overwrite in claims}) == 1:
            stacked = _adjacent_view([mg for mg, _ in claims], ctx.per_group)
        if stacked is not None and grouped_wgrad.supported(stacked, dy, x):
            grouped_wgrad.grouped_wgrad_(stacked, dy, x, offs, claims[0][1])  # the GEMM accumulates in fp32
        else:
            if x.size(0):
                dw = torch._grouped_mm(dy.t(), x, offs=offs)                     # [G, N, K]
            else:  # no rows at all: CUDA's kernel rejects a zero-length contraction (pytorch#192497)
                dw = torch.zeros_like(w)
            if claims is None:
                return (dx, None, None, None) + dw.view(len(weights), *weights[0].shape).unbind(0)
            if stacked is not None:
                store_main_grad(stacked, dw, claims[0][1])
            else:
                for (mg, overwrite), g in zip(claims, dw.view(len(weights), *weights[0].shape).unbind(0)):
                    store_main_grad(mg, g, overwrite)
        # placeholders: the optimizer's hooks find the gradients in main_grad (as tensor.weight_grad's). When
        # the experts run once per dispatch chunk, only one call returns them: autograd would add the
        # chunks' placeholders, a pass over every expert weight for nothing
        if not ctx.placeholders:
            return (dx, None, None, None) + (None,) * len(weights)
        return (dx, None, None, None) + tuple(torch.empty_like(p) for p in weights)


class _GroupedBias(torch.autograd.Function):
    """y + b_g on the rows of group g (rows grouped as for _GroupedLinear, ids: each row's group). The bias
    gradient sums dy over each group's rows with a grouped GEMM against ones, accumulating in fp32 as a
    linear layer's bias gradient does (the backward of an indexed gather accumulates in bf16)."""

    @staticmethod
    def forward(ctx, y, offs, ids, *biases):
        ctx.save_for_backward(offs)
        return y + torch.stack(biases)[ids]

    @staticmethod
    def backward(ctx, dy):
        offs, = ctx.saved_tensors
        dy = dy.contiguous()
        if dy.size(0):
            ones = dy.new_ones(dy.size(0), 8).t()  # [8, rows] column-major: 16-byte strides for any row count
            db = torch._grouped_mm(ones, dy, offs=offs)[:, 0]                  # [G, N]
        else:
            db = dy.new_zeros(offs.numel(), dy.size(1))
        return (dy, None, None) + db.unbind(0)


def _adjacent_view(ts, per_group: int) -> torch.Tensor | None:
    """ts ([out, in] each) as one [len(ts) / per_group, per_group * out, in] view when they lie back to back in
    one storage, in order; else None."""
    t0 = ts[0]
    step = t0.numel() * t0.element_size()
    if not all(t.shape == t0.shape and t.dtype == t0.dtype and t.is_contiguous()
               and t.untyped_storage().data_ptr() == t0.untyped_storage().data_ptr()
               and t.data_ptr() == t0.data_ptr() + i * step for i, t in enumerate(ts)):
        return None
    out, inp = t0.shape
    return t0.as_strided((len(ts) // per_group, per_group * out, inp), (per_group * out * inp, inp, 1))


def _stack(weights, per_group: int) -> torch.Tensor:
    """[len(weights) / per_group, per_group * out, in]: group g's weights concatenated along out (a view where
    they lie back to back, else a copy)."""
    view = _adjacent_view(weights, per_group)
    if view is not None:
        return view
    out, inp = weights[0].shape
    return torch.stack(weights).view(len(weights) // per_group, per_group * out, inp)


def expert_param(shape, init, expert: bool = True):
    """A parameter with the metadata runtime.parallel.tensor gives its own (replicated over TP: tp_dim None;
    sequence_parallel: gradients are partial sums per TP rank) plus `expert` (sharded over EP: routed experts)."""
    p = nn.Parameter(torch.empty(shape))
    p.tp_dim, p.tp_parts, p.init, p.sequence_parallel = None, None, init, True
    if expert:
        p.expert = True
    return p


class SharedExperts(nn.Module):
    """The shared experts of a Qwen- or DeepSeek-style MoE layer, as one SwiGLU MLP of their total width that
    every token goes through beside its routed experts, with Qwen's per-token gate sigmoid(x . w) where the spec
    has one. Like the router they are whole on every rank (not sharded over EP) and see this TP rank's sequence
    shard: their gradients are summed over TP and reduced over dp x cp, as every sequence-parallel parameter's."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        H, Fs = spec.hidden, spec.shared_expert_ffn
        out_std = 0.02 / math.sqrt(2 * spec.num_layers)  # as the dense MLP's output projection
        self.w_gate = expert_param((Fs, H), ("normal", 0.02), expert=False)
        self.w_up = expert_param((Fs, H), ("normal", 0.02), expert=False)
        self.w_down = expert_param((H, Fs), ("normal", out_std), expert=False)
        self.gate = expert_param((1, H), ("normal", 0.02), expert=False) if spec.shared_expert_gate else None

    def forward(self, x):
        y = F.linear(swiglu(torch.cat([F.linear(x, self.w_gate), F.linear(x, self.w_up)], -1)), self.w_down)
        if self.gate is not None:
            y = y * torch.sigmoid(F.linear(x, self.gate))
        return y


def looped_experts(experts: list, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """One expert module after the other on its slice of rows (the host issues every expert's kernels)."""
    outs = []
    start = 0
    for e, n in enumerate(counts):
        outs.append(experts[e](x[start:start + n]))
        start += n
    return torch.cat(outs, 0)


def grouped_experts(experts: list, x: torch.Tensor, counts: torch.Tensor, gated: bool,
                    placeholders: bool = True) -> torch.Tensor:
    """The same MLPs as Expert.forward, each projection one grouped GEMM over all the local experts (in
    order) with the offsets on the device: no host synchronisation and no per-expert kernels. The biases of
    GELU experts are added per row (_GroupedBias). `placeholders`: see _GroupedLinear's backward."""
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    ex = experts
    if gated:
        gate_up = _GroupedLinear.apply(x, offs, 2, placeholders, *(w for m in ex for w in (m.w_gate, m.w_up)))
        return _GroupedLinear.apply(swiglu(gate_up), offs, 1, placeholders, *(m.w_down for m in ex))
    h = _GroupedLinear.apply(x, offs, 1, placeholders, *(m.w_up for m in ex))
    ids = None
    if ex[0].b_up is not None:
        ids = torch.repeat_interleave(torch.arange(len(ex), device=x.device), counts, output_size=x.size(0))
        h = _GroupedBias.apply(h, offs, ids, *(m.b_up for m in ex))
    y = _GroupedLinear.apply(F.gelu(h, approximate=ex[0].approximate), offs, 1, placeholders, *(m.w_down for m in ex))
    return y if ids is None else _GroupedBias.apply(y, offs, ids, *(m.b_down for m in ex))
