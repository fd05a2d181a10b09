"""Tensor parallelism with sequence parallelism (Megatron-LM style), written as autograd functions.

Activations between layers are [seq, batch, hidden] and, with TP t > 1, sharded over the sequence
(each rank holds seq/t rows: sequence parallelism). A column-parallel linear all-gathers the sequence
before its GEMM; a row-parallel linear reduce-scatters its partial sums back to sequence shards. Backward
does the mirror collective. With t == 1 every collective is a no-op and the same code runs.

Overlap (Megatron's "async grad all-reduce"/"sequence-parallel overlap"): in the column-parallel backward
the re-gather of the input (kept sequence-sharded in forward) runs while the input-gradient GEMM runs, and
the reduce-scatter of the input gradient runs while the weight-gradient GEMM runs (async work handles,
placed next to the GEMM they overlap). The forward collectives and the row-parallel backward's all-gather
of the output gradient (needed by both of its GEMMs) stay exposed, as in Megatron without Transformer
Engine userbuffers. Those GEMMs are not split by rows to start on the rows a rank already holds ("local rows
first"): at GPT 6.7B TP2, micro-batch 2, that split gives 0.218 s per step against 0.202 s without it, and 31 ms
of exposed NCCL time in a trace against 26 ms, because the NCCL kernels and the split GEMMs compete for the SMs.

Parameters carry metadata that checkpoints and tests use to map local shards to logical tensors:
  p.tp_dim       dimension split over TP ranks (None: replicated)
  p.tp_parts     logical sizes along tp_dim of the tensors fused into p (qkv, gate/up), each split over TP
  p.sequence_parallel  replicated parameter applied to sequence-sharded activations: its gradient is a
                 partial sum per TP rank and must be all-reduced over TP (norms, row-parallel biases,
                 position / token-type embeddings, BERT's head transform; likewise Qwen3's q/k norms, which each
                 rank applies to its own heads)
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from runtime.parallel import fp8 as _fp8

_ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Done:
    def wait(self):
        return None


_SIZE_AND_RANK: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _size_and_rank(group) -> tuple[int, int]:
    # asked on every collective and every gradient hook; torch.distributed's lookups cost ~10 us of host
    # time each, and a group's size and this rank's place in it never change. Weak keys: a strong reference
    # would keep destroyed groups alive until interpreter exit, where freeing them can abort the process
    got = _SIZE_AND_RANK.get(group)
    if got is None:
        got = _SIZE_AND_RANK[group] = (dist.get_world_size(group), dist.get_rank(group))
    return got


def group_size(group) -> int:
    return 1 if group is None else _size_and_rank(group)[0]


def group_rank(group) -> int:
    return 0 if group is None else _size_and_rank(group)[1]


def gather_seq(x: torch.Tensor, group, async_op: bool = False):
    """All-gather along dim 0 (the sequence). Returns (tensor, work)."""
    t = group_size(group)
    if t == 1:
        return x, _Done()
    out = torch.empty((x.shape[0] * t,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    work = _ag(out, x.contiguous(), group=group, async_op=async_op)
    return out, (work if async_op else _Done())


def reduce_scatter_seq(x: torch.Tensor, group, async_op: bool = False):
    """Reduce-scatter (sum) along dim 0. Returns (tensor, work)."""
    t = group_size(group)
    if t == 1:
        return x, _Done()
    if x.shape[0] % t:  # planner/legality.py refuses such a layout
        raise ValueError(f"sequence {x.shape[0]} is not divisible by TP {t} (sequence parallelism)")
    out = torch.empty((x.shape[0] // t,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    work = _rs(out, x.contiguous(), group=group, async_op=async_op)
    return out, (work if async_op else _Done())


class GatherFromSequence(torch.autograd.Function):
    """Forward all-gather of the sequence, backward reduce-scatter."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return gather_seq(x, group)[0]

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_seq(g, ctx.group)[0], None


class ReduceScatterToSequence(torch.autograd.Function):
    """Forward reduce-scatter to sequence shards, backward all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_seq(x, group)[0]

    @staticmethod
    def backward(ctx, g):
        return gather_seq(g, ctx.group)[0], None


def _recompute(fn, saved):
    with torch.no_grad():
        return fn(saved)


_FP32_OUT_ADDMM = [True]  # cleared once if this torch/device has no addmm with an fp32 output for bf16 inputs


def _accumulate_mm_(main_grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, overwrite: bool = False) -> None:
    """main_grad += a @ b (or main_grad = a @ b), in main_grad's precision (fp32, or bf16 under a plan's
    grad_dtype bf16), by the GEMM itself."""
    beta = 0.0 if overwrite else 1.0  # beta 0: the GEMM does not read main_grad (stale values, even NaN, vanish)
    if a.dtype == main_grad.dtype:
        torch.addmm(main_grad, a, b, beta=beta, out=main_grad)
        return
    if _FP32_OUT_ADDMM[0] and main_grad.dtype == torch.float32:
        try:
            torch.ops.aten.addmm.dtype_out(main_grad, a, b, main_grad.dtype, beta=beta, out=main_grad)
            return
        except (RuntimeError, NotImplementedError):
            _FP32_OUT_ADDMM[0] = False
    store_main_grad(main_grad, a @ b, overwrite)


def store_main_grad(main_grad: torch.Tensor, grad: torch.Tensor, overwrite: bool) -> None:
    """main_grad = grad (the step's first write, claim_main_grad's `overwrite`) or main_grad += grad."""
    if overwrite:
        main_grad.copy_(grad)
    else:
        main_grad.add_(grad)


def claim_main_grad(p: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """(p's `main_grad` view (fp32, or bf16 under grad_dtype bf16), overwrite?) for a backward that writes p's gradient there itself, or None when
    the optimizer gave p none. The protocol every such writer follows (weight_grad, bias_grad,
    _EmbeddingLookup, runtime/norm.py): the optimizer does not zero these views between steps but sets
    `main_grad_fresh`, so the step's first write overwrites rather than adds; `grad_in_main_grad` tells its
    per-parameter hook that the gradient is already there (it skips its own add)."""
    main_grad = getattr(p, "main_grad", None)
    if main_grad is None:
        return None
    overwrite = getattr(p, "main_grad_fresh", False)
    p.main_grad_fresh = False
    p.grad_in_main_grad = True
    return main_grad, overwrite


def weight_grad(weight: torch.Tensor, grad_out: torch.Tensor, inp: torch.Tensor):
    """The weight gradient dY^T X of a linear layer (tokens are the reduction dimension).

    Gradient-accumulation fusion (Megatron's): when the optimizer gave the weight an fp32 `main_grad`
    (a view into its flat gradient buffer), the GEMM accumulates straight into it, so there is no bf16
    gradient tensor and no separate fp32 add per micro-batch. The optimizer does not zero these views between
    steps: it sets `main_grad_fresh`, and the step's first weight-gradient GEMM overwrites rather than adds
    (saves a pass over 4 bytes per parameter). The returned placeholder only lets autograd run the
    optimizer's per-parameter hook (which sees `grad_in_main_grad` and skips its own add)."""
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    x2 = inp.reshape(-1, inp.shape[-1])
    target = claim_main_grad(weight)
    if target is None:
        return g2.t().matmul(x2)
    main_grad, overwrite = target
    _accumulate_mm_(main_grad, g2.t(), x2, overwrite=overwrite)
    return torch.empty_like(weight)


def bias_grad(bias: torch.Tensor, grad_out: torch.Tensor):
    """A linear layer's bias gradient, dY summed over its rows. Where the optimizer gave the bias an fp32
    `main_grad`, the sum goes there directly, accumulated in fp32 (weight_grad's protocol): on the step's first
    use one reduction writes it (`out=`), no bf16 gradient and no separate mixed-dtype add by the hook (which
    would be 195 adds of about 4 us each in a GPT-1.3B step)."""
    g2 = grad_out.reshape(-1, grad_out.shape[-1])
    target = claim_main_grad(bias)
    if target is None:
        return g2.sum(0)
    main_grad, overwrite = target
    if overwrite:
        torch.sum(g2, 0, dtype=main_grad.dtype, out=main_grad)
    else:
        main_grad.add_(g2.sum(0, dtype=main_grad.dtype))
    return torch.empty_like(bias)


class _ColumnParallelFn(torch.autograd.Function):
    """y[s, b, out/t] = gather_seq(x[s/t, b, in]) @ W_local^T (+ b_local).

    Saves the sequence-sharded input (or, for selective recompute, the tensor it is cheaply recomputed
    from: the norm input), never the gathered one; backward re-gathers it."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, overlap, recompute_fn, recompute_input, fp8=False):
        x_full, _ = gather_seq(x, group)
        y = _fp8.linear(x_full, weight, bias) if fp8 else F.linear(x_full, weight, bias)
        ctx.group, ctx.overlap, ctx.recompute_fn, ctx.fp8 = group, overlap, recompute_fn, fp8
        ctx.bias = bias
        ctx.param = weight  # the Parameter itself: under activation checkpointing the saved copy lacks main_grad
        ctx.save_for_backward(recompute_input if recompute_fn is not None else x, weight)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        saved, weight = ctx.saved_tensors
        x = _recompute(ctx.recompute_fn, saved) if ctx.recompute_fn is not None else saved
        # (1) re-gather the input while the input-gradient GEMM runs
        x_full, gather = gather_seq(x, ctx.group, async_op=ctx.overlap)
        grad_x_full = _fp8.input_grad(grad_y, weight) if ctx.fp8 else grad_y.matmul(weight)
        gather.wait()
        # (2) reduce-scatter the input gradient while the weight-gradient GEMM runs
        grad_x, scatter = reduce_scatter_seq(grad_x_full, ctx.group, async_op=ctx.overlap)
        grad_w = weight_grad(ctx.param, grad_y, x_full)
        grad_b = bias_grad(ctx.bias, grad_y) if ctx.bias is not None else None
        scatter.wait()
        return grad_x, grad_w, grad_b, None, None, None, None, None


class _RowParallelFn(torch.autograd.Function):
    """y[s/t, b, out] = reduce_scatter_seq(x[s, b, in/t] @ W_local^T) + b. Saves x (or its recompute source).
    With t == 1 the bias goes into the GEMM's epilogue; otherwise it is added to the reduced shard."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, recompute_fn, recompute_input, fp8=False):
        mm = _fp8.linear if fp8 else F.linear
        if group_size(group) == 1:
            y = mm(x, weight, bias)
        else:
            y, _ = reduce_scatter_seq(mm(x, weight, None), group)
            if bias is not None:
                y.add_(bias)
        ctx.group, ctx.recompute_fn, ctx.fp8 = group, recompute_fn, fp8
        ctx.bias = bias
        ctx.param = weight  # see _ColumnParallelFn
        ctx.save_for_backward(recompute_input if recompute_fn is not None else x, weight)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        saved, weight = ctx.saved_tensors
        x = _recompute(ctx.recompute_fn, saved) if ctx.recompute_fn is not None else saved
        grad_b = bias_grad(ctx.bias, grad_y) if ctx.bias is not None else None
        grad_full, _ = gather_seq(grad_y, ctx.group)  # needed by both GEMMs: exposed
        grad_x = _fp8.input_grad(grad_full, weight) if ctx.fp8 else grad_full.matmul(weight)
        return grad_x, weight_grad(ctx.param, grad_full, x), grad_b, None, None, None, None


PARAM_ATTRS = ("tp_dim", "tp_parts", "init", "sequence_parallel", "logical_name", "logical_leaf", "tied_copy",
               "expert")
"""Metadata our parameters carry; wrappers that replace parameters (FSDP2) must copy it over."""


def param_meta(module: nn.Module) -> dict:
    return {n: {a: getattr(p, a) for a in PARAM_ATTRS if hasattr(p, a)} for n, p in module.named_parameters()}


def restore_param_meta(module: nn.Module, meta: dict) -> None:
    for n, p in module.named_parameters():
        for a, v in meta.get(n, {}).items():
            setattr(p, a, v)


def _tp_param(shape, tp_dim, parts=None, init=("normal", 0.02), sequence_parallel=False):
    p = nn.Parameter(torch.empty(shape))
    p.tp_dim, p.tp_parts, p.init, p.sequence_parallel = tp_dim, parts, init, sequence_parallel
    return p


class ColumnParallelLinear(nn.Module):
    """Output features split over TP. `out_parts` lists fused logical outputs (e.g. q, k, v), each split."""

    def __init__(self, in_features: int, out_parts: list[int], bias: bool, group, overlap: bool = True,
                 std: float = 0.02):
        super().__init__()
        t = group_size(group)
        if any(o % t for o in out_parts):  # planner/legality.py refuses such a layout
            raise ValueError(f"the outputs {out_parts} of a column-parallel layer are not divisible by TP {t}")
        self.group, self.overlap = group, overlap
        self.out_local = sum(out_parts) // t
        self.weight = _tp_param((self.out_local, in_features), 0, list(out_parts), ("normal", std))
        self.weight.wgrad_fusable = True  # used once per forward: its gradient may go straight to main_grad
        self.bias = _tp_param((self.out_local,), 0, list(out_parts), ("zeros",)) if bias else None
        if self.bias is not None:
            self.bias.wgrad_fusable = True  # bias_grad sums straight into main_grad
        self.fp8 = False  # forward and input-gradient GEMMs in FP8 (runtime.parallel.fp8; enable_fp8 sets it)
        self.skip_bias_add = False
        """The GEMM leaves out the bias and the caller adds it (runtime/bias_gelu.py, with the activation)."""

    def forward(self, x, recompute=None, weight=None):
        """x: [s/t, b, in]. recompute=(fn, src): x == fn(src); keep src instead of x (selective recompute)."""
        fn, src = recompute if recompute is not None else (None, None)
        w = self.weight if weight is None else weight
        bias = None if self.skip_bias_add else self.bias
        return _ColumnParallelFn.apply(x, w, bias, self.group, self.overlap, fn, src, self.fp8)


class SharedKVQKVLinear(nn.Module):
    """The fused qkv projection where TP exceeds the KV heads (tp % kv_heads == 0): each rank computes its q heads
    and the one KV head they attend with, as Megatron-Core does when num_query_groups < TP.

    Parameters: `q_weight` [q_width/t, in] (split over TP like a column-parallel weight), `k_weight` and `v_weight`
    [kv_width, in], whole on every TP rank, and `q_bias`, `k_bias`, `v_bias` likewise. A rank multiplies by its q
    rows and its KV head's K and V rows only, so its K/V gradients are zero outside that head's rows; they are marked
    sequence_parallel, and the all-reduce over TP that such parameters get (runtime/parallel/data.py) sums each head's
    gradient over exactly the ranks that share it. Every rank so holds the same K/V weights (initialised from their
    logical name) and keeps them identical step after step. Their logical names are the fused qkv's parts
    (`logical_leaf`: qkv.weight.part0, .part1, .part2), so a checkpoint moves between this module and
    ColumnParallelLinear (runtime/checkpoint.py). Output: [s, b, (q_width/t + 2 head_dim)], the layout of
    ColumnParallelLinear over [q, k, v] with one KV head."""

    def __init__(self, in_features: int, q_width: int, kv_heads: int, head_dim: int, bias: bool, group,
                 overlap: bool = True):
        super().__init__()
        t, r = group_size(group), group_rank(group)
        if q_width % t or t % kv_heads:  # planner/legality.py refuses such a layout
            raise ValueError(f"TP {t} cannot share {kv_heads} KV heads over a q width of {q_width}: the q width must "
                             f"divide by TP and TP by the KV heads")
        self.group, self.overlap, self.d = group, overlap, head_dim
        self.head = r // (t // kv_heads)  # the KV head this rank's q heads use
        kv_width = kv_heads * head_dim
        self.q_weight = _tp_param((q_width // t, in_features), 0, [q_width], ("normal", 0.02))
        self.k_weight = _tp_param((kv_width, in_features), None, sequence_parallel=True)
        self.v_weight = _tp_param((kv_width, in_features), None, sequence_parallel=True)
        self.q_bias = _tp_param((q_width // t,), 0, [q_width], ("zeros",)) if bias else None
        self.k_bias = _tp_param((kv_width,), None, init=("zeros",), sequence_parallel=True) if bias else None
        self.v_bias = _tp_param((kv_width,), None, init=("zeros",), sequence_parallel=True) if bias else None
        for kind in ("weight", "bias"):
            for i, part in enumerate("qkv"):
                p = getattr(self, f"{part}_{kind}")
                if p is not None:
                    p.logical_leaf = f"{kind}.part{i}"
        self.fp8 = False  # see ColumnParallelLinear

    def _rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q's rows, then this rank's KV head's K rows and V rows."""
        lo = self.head * self.d
        return torch.cat([q, k[lo:lo + self.d], v[lo:lo + self.d]])

    def forward(self, x, recompute=None):
        fn, src = recompute if recompute is not None else (None, None)
        w = self._rows(self.q_weight, self.k_weight, self.v_weight)
        b = self._rows(self.q_bias, self.k_bias, self.v_bias) if self.q_bias is not None else None
        return _ColumnParallelFn.apply(x, w, b, self.group, self.overlap, fn, src, self.fp8)


class RowParallelLinear(nn.Module):
    """Input features split over TP; output reduce-scattered to sequence shards; bias added after."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group, std: float = 0.02):
        super().__init__()
        t = group_size(group)
        if in_features % t:  # planner/legality.py refuses such a layout
            raise ValueError(f"the inputs {in_features} of a row-parallel layer are not divisible by TP {t}")
        self.group = group
        self.weight = _tp_param((out_features, in_features // t), 1, None, ("normal", std))
        self.weight.wgrad_fusable = True
        self.bias = _tp_param((out_features,), None, None, ("zeros",), sequence_parallel=True) if bias else None
        if self.bias is not None:
            self.bias.wgrad_fusable = True
        self.fp8 = False  # see ColumnParallelLinear

    def forward(self, x, recompute=None):
        fn, src = recompute if recompute is not None else (None, None)
        return _RowParallelFn.apply(x, self.weight, self.bias, self.group, fn, src, self.fp8)


def enable_fp8(module: nn.Module) -> int:
    """Run the forward and input-gradient GEMMs of every column- and row-parallel linear inside `module` in FP8
    (runtime/parallel/fp8.py). Apply it to the transformer layers, not to the embedding or the output layer.
    Returns how many linears it switched."""
    n = 0
    for m in module.modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear, SharedKVQKVLinear)):
            m.fp8 = True
            n += 1
    return n


class _EmbeddingLookup(torch.autograd.Function):
    """F.embedding whose weight gradient goes straight into the weight's fp32 `main_grad` (when the optimizer
    gave it one) by an index_add of the rows: no dense bf16 [vocab, hidden] gradient, no fp32 add of it
    afterwards. Why: that add alone takes 1.2 ms of a 131 ms GPT-1.3B step (a mixed-dtype add runs
    unvectorised), the dense gradient's fill and sort 0.4 ms more. The
    protocol is claim_main_grad's. The tied output layer's weight-gradient GEMM runs earlier in backward and accumulates into the same view."""

    @staticmethod
    def forward(ctx, ids, weight):
        ctx.save_for_backward(ids)
        ctx.param = weight
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, g):
        ids, = ctx.saved_tensors
        weight = ctx.param
        target = claim_main_grad(weight)
        if target is None:
            return None, torch.ops.aten.embedding_backward(g, ids, weight.shape[0], -1, False, False)
        main_grad, overwrite = target
        if main_grad.dtype != torch.float32:
            # bf16 main gradient: an index_add would sum a frequent token's rows in bf16; the dense backward
            # sums each row's occurrences in fp32 and rounds once
            dense = torch.ops.aten.embedding_backward(g, ids, weight.shape[0], -1, False, False)
            store_main_grad(main_grad, dense, overwrite)
            return None, torch.empty_like(weight)
        if overwrite:
            main_grad.zero_()
        main_grad.index_add_(0, ids.reshape(-1), g.reshape(-1, g.shape[-1]).to(main_grad.dtype))
        return None, torch.empty_like(weight)


class VocabParallelEmbedding(nn.Module):
    """Rows of the vocabulary split over TP; the lookup of the full sequence gives partial sums that are
    reduce-scattered to sequence shards (one collective, as Megatron with sequence parallelism)."""

    def __init__(self, vocab: int, hidden: int, group):
        super().__init__()
        t = group_size(group)
        if vocab % t:  # planner/legality.py refuses such a layout
            raise ValueError(f"padded vocabulary {vocab} is not divisible by TP {t}")
        self.group, self.vocab_local = group, vocab // t
        self.start = group_rank(group) * self.vocab_local
        self.weight = _tp_param((self.vocab_local, hidden), 0, [vocab], ("normal", 0.02))
        self.weight.wgrad_fusable = True  # its gradient goes straight to main_grad (_EmbeddingLookup)

    def forward(self, tokens):  # tokens [s, b] -> [s/t, b, h]
        if group_size(self.group) == 1:
            return _EmbeddingLookup.apply(tokens, self.weight)
        local = tokens - self.start
        outside = (local < 0) | (local >= self.vocab_local)
        out = _EmbeddingLookup.apply(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return ReduceScatterToSequence.apply(out, self.group)


# -- logical <-> local views (checkpoints, tests) --------------------------------------------------

def local_shard(full: torch.Tensor, tp_dim, parts, rank: int, t: int) -> torch.Tensor:
    """The TP-local piece of a logical tensor."""
    if tp_dim is None or t == 1:
        return full
    parts = parts or [full.shape[tp_dim]]
    pieces = [p.chunk(t, dim=tp_dim)[rank] for p in full.split(parts, dim=tp_dim)]
    return torch.cat(pieces, dim=tp_dim)


def logical_parts(local: torch.Tensor, tp_dim, parts, t: int) -> list[torch.Tensor]:
    """Split a TP-local tensor into the local pieces of each fused logical part."""
    if tp_dim is None:
        return [local]
    parts = parts or [local.shape[tp_dim] * t]
    return list(local.split([p // t for p in parts], dim=tp_dim))


def gather_logical(local: torch.Tensor, tp_dim, parts, group) -> torch.Tensor:
    """All-gather a TP-local tensor into its logical (TP1) form."""
    t = group_size(group)
    if tp_dim is None or t == 1:
        return local
    pieces = [torch.empty_like(local) for _ in range(t)]
    dist.all_gather(pieces, local.contiguous(), group=group)
    per_rank = [logical_parts(p, tp_dim, parts, t) for p in pieces]
    return torch.cat([torch.cat([r[i] for r in per_rank], dim=tp_dim) for i in range(len(per_rank[0]))], dim=tp_dim)
