"""Expert parallelism: a Mixtral/Qwen-style MoE MLP with all-to-all token dispatch over the EP group.

Layout of the weights
  * Router: `router.weight` [num_experts, hidden], no bias, replicated on every rank (not an expert param).
  * Experts: `num_experts / ep` local experts per rank, rank `ep_rank` of the EP group owning global experts
    [ep_rank * E_local, (ep_rank + 1) * E_local), stored as `experts.<global index>.{w_gate,w_up,w_down}`
    (SwiGLU, no bias) for Llama-family specs, or `{w_up,b_up,w_down,b_down}` (GELU) for GPT-family specs:
    exactly `ModelSpec.expert_params()` per expert, `mlp_params()` per layer at EP1. Parameter names
    carry the global expert index, so init (seeded by name) and checkpoints do not depend on EP.
  * Shared experts (Qwen / DeepSeek style, `spec.shared_expert_ffn`): `shared.{w_gate,w_up,w_down}` and, gated,
    `shared.gate`; one SwiGLU MLP every token goes through, whole on every rank like the router (SharedExperts).
    Under EP they run while the dispatch all-to-all is in flight.
  * Expert weights are sharded by EP only. Tensor parallelism does not apply to them: when tp > 1 the MoE
    input arrives sequence-parallel-sharded (the residual stream between TP blocks is split over the
    sequence), each TP rank routes and dispatches *its own* tokens, so there is no TP communication inside
    the MoE layer, and the expert (and router) weights are replicated across the TP ranks, each TP rank
    computing their gradient from its own sequence shard.

Gradient reduction (runtime.parallel.data does this; the loss convention there is "sum over dp*cp")
  * Every expert parameter has `param.expert = True` and `param.sequence_parallel = True`; the router
    weight has `sequence_parallel = True` only.
  * Expert gradients: SUM over the TP group when tp > 1 (each TP rank saw different tokens), then SUM over
    `groups.expert_dp` (the dp*cp/ep ranks holding the same experts). No extra factor: through the
    all-to-all backward an expert's gradient on one rank already holds the contributions of the tokens
    of all ep ranks of its EP group, so sum over expert_dp == sum over dp*cp of the per-rank gradients.
    (Under an averaging convention it would be sum over expert_dp divided by dp*cp, not by |expert_dp|.)
  * Router gradient: like every sequence-parallel parameter: SUM over TP, then over dp_cp.
  * Optimizer sharding and the gradient norm: expert params are distinct per EP rank: shard their
    optimizer state over expert_dp, and add their squared norm over the EP group once.

Routing: softmax over the experts (fp32), top-k, weights renormalised to sum to one (Mixtral;
`normalize_topk=False` keeps the raw softmax weights, as Qwen2-MoE's default). Load-balancing loss (Switch
Transformer / Mixtral's `load_balancing_loss_func`): aux = E * sum_e f_e * P_e with f_e the fraction of the
(token, slot) assignments sent to expert e, summed over the k slots, and P_e the mean router probability of
e, over the micro-batch's tokens. Under TP (sequence parallel) and CP each rank holds a shard of them: f is
summed over the cp x tp group (`groups.cp_tp`, a [k, E] all-reduce of counts, no gradient) and P stays local,
so the rank's loss E * sum_e f_e * P_e(local) averaged over the tp * cp shards is exactly the loss of the whole
micro-batch, whatever the layout. After each forward `self.aux_loss` holds the rank's loss (a tensor in the
graph) divided by the TP degree (summing gradients over TP averages over TP). The training loop adds it to
each micro-batch's loss, scaled to a mean over micro-batches and dp*cp ranks since gradients are summed over
both:
    loss = loss_sum / global_label_count + collect_aux_loss(stage) / (num_micro_batches * dp * cp)
(`collect_aux_loss` multiplies by each layer's `aux_coeff`). It must be collected right after the
forward that produced it (a later forward, or a recompute, replaces the attribute).

Dispatch: dropless by default (every assignment computed); with `capacity_factor` set, each expert takes at
most ceil(capacity_factor * tokens * k / E) assignments per rank-local batch, in token order, and the rest
are dropped (they contribute zero; the other slots keep their weights). Assignments are sorted by expert,
the counts exchanged with one small all_to_all, the tokens sent with all_to_all_single with variable splits,
regrouped by local expert, computed, and sent back the same way. Dropless, every row movement (the gather of
tokens by expert, the regrouping, the weighted combine) is an index_select whose backward is an index_select
too (and a sum over the k copies of a token): autograd's backward of indexing sorted the indices and
accumulated with atomics (session 7: EP2 x DP2 at 101-105k tokens/s per GPU without it, 97k with it). The
local experts run as grouped GEMMs (torch._grouped_mm: one kernel per projection for all of them, the
per-expert row counts as offsets on the device) where the device supports it (grouped_mm_supported: CUDA
bf16 on Hopper), else as a loop over the experts. The host waits for the GPU at most once per layer: at EP >
1, for the split sizes of the all-to-alls (one .tolist()); at EP1 the grouped path never waits (the loop
does, for its slices; dropping by capacity does, for its boolean selection).

Tried and taken out (session 6, commits 206a82e and 017cb7c): a dispatch with fixed-size buffers at EP2 that
never reads the split sizes back (every (token, expert) pair, then every token once per destination rank with
its ids and weights, in blocks of the most a rank can send; grouped GEMMs on the real rows only). It removed
most of the GPU idle time the per-layer wait causes (69-77 ms down to 15-19 ms per traced step), but the
step got slower: 67.3% of the dense model against 75.0% for this exact dispatch, both measured in one call on
2 H200. It moved more rows through the all-to-alls, gathers and masks, and one rank then waited about 100 ms
per step in the all-to-alls.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from planner.model import ModelSpec
from runtime import grouped_wgrad
from runtime.moe_rows import combine_backward, gather_sum
from runtime.parallel.tensor import claim_main_grad, store_main_grad
from runtime.swiglu import swiglu

__all__ = ["MoEMLP", "collect_aux_loss", "grouped_mm_supported"]


class _Pending:
    """The in-flight all-to-all between an _AllToAllStart and its _AllToAllWait, one each way: forward's
    transfer of the rows, and backward's of their gradient."""
    work = None
    reverse = None
    """(splits out, splits in, group, input shape) of the reverse transfer, for backward."""
    bwd_work = None
    bwd_out = None


class _AllToAllStart(torch.autograd.Function):
    """Launch all_to_all_single (async) and return its output buffer, not yet filled: _AllToAllWait on the
    same `pending` makes it safe to read. Backward waits for the reverse transfer that _AllToAllWait's
    backward launched, so whatever autograd runs between the two overlaps it."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, pending):
        ctx.pending = pending
        x = x.contiguous()
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        pending.work = dist.all_to_all_single(out, x, out_splits, in_splits, group=group, async_op=True)
        pending.reverse = (in_splits, out_splits, group, x.shape)
        return out

    @staticmethod
    def backward(ctx, g):
        p = ctx.pending
        p.bwd_work.wait()
        out, p.bwd_out, p.bwd_work = p.bwd_out, None, None
        return out, None, None, None, None


class _AllToAllWait(torch.autograd.Function):
    """Identity once the transfer started by _AllToAllStart on `pending` has arrived (on CUDA the stream
    waits, not the host). Backward launches the reverse transfer of the gradient and returns at once."""

    @staticmethod
    def forward(ctx, out, pending):
        ctx.pending = pending
        pending.work.wait()
        pending.work = None
        return out

    @staticmethod
    def backward(ctx, g):
        p = ctx.pending
        out_splits, in_splits, group, shape = p.reverse
        g = g.contiguous()
        p.bwd_out = g.new_empty((sum(out_splits),) + tuple(shape[1:]))
        p.bwd_work = dist.all_to_all_single(p.bwd_out, g, out_splits, in_splits, group=group, async_op=True)
        return g, None


class Expert(nn.Module):
    """One expert: SwiGLU (w_gate, w_up: [ffn, hidden], w_down: [hidden, ffn], no bias) for gated specs,
    else GELU (tanh) with biases when the spec has them. Weights in nn.Linear's [out, in] layout."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        H, Fh = spec.hidden, spec.ffn_hidden
        out_std = 0.02 / math.sqrt(2 * spec.num_layers)  # as the dense MLP's output projection
        self.gated = spec.gated_mlp
        self.w_gate = _param((Fh, H), ("normal", 0.02)) if self.gated else None
        self.w_up = _param((Fh, H), ("normal", 0.02))
        self.w_down = _param((H, Fh), ("normal", out_std))
        bias = spec.has_bias and not self.gated
        self.b_up = _param((Fh,), ("zeros",)) if bias else None
        self.b_down = _param((H,), ("zeros",)) if bias else None

    def forward(self, x):
        if self.gated:  # one [gate | up] tensor through runtime/swiglu.py, as the grouped path keeps it
            return F.linear(swiglu(torch.cat([F.linear(x, self.w_gate), F.linear(x, self.w_up)], -1)), self.w_down)
        return F.linear(F.gelu(F.linear(x, self.w_up, self.b_up), approximate="tanh"), self.w_down, self.b_down)


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
        ctx.save_for_backward(x, offs, *weights)
        return torch._grouped_mm(x, _stack(weights, per_group).transpose(1, 2), offs=offs)

    @staticmethod
    def backward(ctx, dy):
        x, offs, *weights = ctx.saved_tensors
        dy = dy.contiguous()  # the kernels reject stride-0 (expanded) gradients
        w = _stack(weights, ctx.per_group)                                   # [G, N, K]
        dx = torch._grouped_mm(dy, w, offs=offs)
        claims = [claim_main_grad(p) for p in weights] if all(
            getattr(p, "main_grad", None) is not None for p in weights) else None
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


def _param(shape, init, expert: bool = True):
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
        self.w_gate = _param((Fs, H), ("normal", 0.02), expert=False)
        self.w_up = _param((Fs, H), ("normal", 0.02), expert=False)
        self.w_down = _param((H, Fs), ("normal", out_std), expert=False)
        self.gate = _param((1, H), ("normal", 0.02), expert=False) if spec.shared_expert_gate else None

    def forward(self, x):
        y = F.linear(swiglu(torch.cat([F.linear(x, self.w_gate), F.linear(x, self.w_up)], -1)), self.w_down)
        if self.gate is not None:
            y = y * torch.sigmoid(F.linear(x, self.gate))
        return y


class MoEMLP(nn.Module):
    """Drop-in for runtime.model.MLP: forward(x, selective=False, recompute=None) with x [s/t, b, h] (any
    leading shape works). See the module docstring for the layout, routing and gradient contract.

    Parameters: `router.weight` [E, hidden] (replicated, sequence_parallel) and `experts.<e>.*` for the
    local experts, keyed by their GLOBAL index e, so parameter names, runtime.model.init_weights (seeded
    by parameter name) and checkpoints are the same under every EP degree."""

    def __init__(self, spec: ModelSpec, groups=None, capacity_factor: float | None = None,
                 normalize_topk: bool = True, aux_coeff: float = 0.01):
        super().__init__()
        if not spec.is_moe:
            raise ValueError(f"model '{spec.name}' has no experts")
        self.spec = spec
        self.num_experts, self.top_k = spec.num_experts, spec.top_k
        self.hidden, self.ffn = spec.hidden, spec.ffn_hidden
        self.capacity_factor = capacity_factor
        self.normalize_topk = normalize_topk
        self.aux_coeff = aux_coeff
        """Weight of the load-balancing loss in the training loss (Mixtral uses 0.02, Qwen2-MoE 0.001)."""
        # runtime.mesh.ParallelGroups has the EP process group as `.ep` (None when ep == 1); any other
        # object with an `ep_group` attribute works too
        ep_group = getattr(groups, "ep", None)
        if not isinstance(ep_group, dist.ProcessGroup):
            ep_group = getattr(groups, "ep_group", None)
        self.ep_group = ep_group
        self.ep = dist.get_world_size(ep_group) if ep_group is not None else 1
        self.ep_rank = dist.get_rank(ep_group) if ep_group is not None else 0
        tp_group = getattr(groups, "tp", None)
        self.tp = dist.get_world_size(tp_group) if isinstance(tp_group, dist.ProcessGroup) else 1
        if self.num_experts % self.ep:
            raise ValueError(f"{self.num_experts} experts are not divisible by EP {self.ep}")
        self.local_experts = self.num_experts // self.ep
        self.expert_offset = self.ep_rank * self.local_experts
        self.router = nn.Module()
        self.router.weight = nn.Parameter(torch.empty(self.num_experts, self.hidden))
        w = self.router.weight
        w.tp_dim, w.tp_parts, w.init, w.sequence_parallel = None, None, ("normal", 0.02), True
        self.experts = nn.ModuleDict({str(self.expert_offset + e): Expert(spec)
                                      for e in range(self.local_experts)})
        self.shared = SharedExperts(spec) if spec.shared_expert_ffn else None
        # each projection's local expert weights form a run that the optimizer's flat buffers lay out back to
        # back (runtime/parallel/data.py): the grouped GEMMs take them, and their gradients, as one view
        ex = list(self.experts.values())
        first = [w for m in ex for w in (m.w_gate, m.w_up)] if spec.gated_mlp else [m.w_up for m in ex]
        for run in (first, [m.w_down for m in ex]):
            key = object()
            for i, w in enumerate(run):
                w.stack_run, w.stack_index, w.wgrad_fusable = key, i, True
        seq_group = getattr(groups, "cp_tp", None)
        self.seq_group = seq_group if isinstance(seq_group, dist.ProcessGroup) and \
            dist.get_world_size(seq_group) > 1 else None
        """The ranks holding shards of this rank's micro-batch (cp x tp): the assignment fractions of the
        load-balancing loss are summed over them; None when the rank holds whole sequences."""
        self.aux_loss: torch.Tensor | None = None
        self.last_tokens_per_expert: torch.Tensor | None = None
        lay = getattr(groups, "layout", None)
        self.dispatch_chunks = 2 if self.ep > 1 and getattr(lay, "overlap_ep", False) else 1
        """Chunks of this rank's tokens dispatched one after the other, so that all-to-alls overlap the
        experts (Layout.overlap_ep); 1 sends them at once."""
        self.grouped_mm: bool | None = None
        """None: run the experts as grouped GEMMs where grouped_mm_supported says so, else as a loop;
        True / False forces one path (tests compare them on CPU)."""
        self.reset_parameters()

    def expert_parameters(self):
        return (p for p in self.experts.parameters())

    @torch.no_grad()
    def reset_parameters(self, seed: int = 1234) -> None:
        """Standalone initialisation (runtime.model.init_weights does the same for a whole stage): every
        tensor drawn from a generator seeded by its name, so a global expert's weights do not depend on EP."""
        import zlib
        for name, p in self.named_parameters():
            if p.init[0] == "zeros":
                p.zero_()
            else:
                g = torch.Generator(device=p.device).manual_seed(seed + zlib.crc32(name.encode()))
                p.normal_(0.0, p.init[1], generator=g)

    # -- routing -----------------------------------------------------------------------------------
    def route(self, x2d: torch.Tensor):
        """Returns (expert ids [T, k], weights [T, k] fp32, aux loss)."""
        logits = _RouterLogits.apply(x2d, self.router.weight)
        probs = torch.softmax(logits, dim=-1)
        topv, topi = probs.topk(self.top_k, dim=-1)
        if self.normalize_topk:
            topv = topv / topv.sum(-1, keepdim=True)
        E = self.num_experts
        with torch.no_grad():  # f_e: no gradient flows through the top-k choice
            tokens_per_expert = F.one_hot(topi, E).to(probs.dtype).mean(0)   # [k, E]
            if self.seq_group is not None:  # the shards are equal (sequence parallel, CP's mirrored chunks)
                dist.all_reduce(tokens_per_expert, group=self.seq_group)
                tokens_per_expert /= dist.get_world_size(self.seq_group)
        aux = E * (tokens_per_expert * probs.mean(0)).sum()
        return topi, topv, aux

    # -- experts -----------------------------------------------------------------------------------
    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert e (global index expert_offset + e)."""
        return self.experts[str(self.expert_offset + e)](x)

    def _run_local_experts(self, x: torch.Tensor, counts: torch.Tensor,
                           host_counts: list[int] | None = None, placeholders: bool = True) -> torch.Tensor:
        """x holds rows grouped by local expert, counts[e] (on the device) rows for local expert e;
        host_counts is the same as a list where the caller already waited for it. Every expert runs, on
        zero rows if it got none, so every expert parameter always receives a gradient (possibly zero):
        bucketed gradient hooks in the data-parallel code then fire on every rank. `placeholders`: whether
        this call's backward hands autograd the grouped path's placeholder weight gradients (exactly one
        call per forward does, when the experts run once per dispatch chunk)."""
        if self.use_grouped_mm(x):
            return self._grouped_experts(x, counts, placeholders)
        return self._looped_experts(x, counts.tolist() if host_counts is None else host_counts)

    def use_grouped_mm(self, x: torch.Tensor) -> bool:
        """The path for rows x: `self.grouped_mm` where set, else what grouped_mm_supported says."""
        if self.grouped_mm is not None:
            return self.grouped_mm
        return grouped_mm_supported(x, self.hidden, self.ffn)

    def _looped_experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """One expert module after the other on its slice of rows (the host issues every expert's kernels)."""
        outs = []
        start = 0
        for e, n in enumerate(counts):
            outs.append(self._expert(e, x[start:start + n]))
            start += n
        return torch.cat(outs, 0)

    def _grouped_experts(self, x: torch.Tensor, counts: torch.Tensor, placeholders: bool = True) -> torch.Tensor:
        """The same MLPs as Expert.forward, each projection one grouped GEMM over all the local experts with
        the offsets on the device: no host synchronisation and no per-expert kernels. The biases of GELU
        experts are added per row (_GroupedBias)."""
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        ex = list(self.experts.values())                                      # local experts in order
        if self.spec.gated_mlp:
            gate_up = _GroupedLinear.apply(x, offs, 2, placeholders, *(w for m in ex for w in (m.w_gate, m.w_up)))
            return _GroupedLinear.apply(swiglu(gate_up), offs, 1, placeholders, *(m.w_down for m in ex))
        h = _GroupedLinear.apply(x, offs, 1, placeholders, *(m.w_up for m in ex))
        ids = None
        if ex[0].b_up is not None:
            ids = torch.repeat_interleave(torch.arange(len(ex), device=x.device), counts, output_size=x.size(0))
            h = _GroupedBias.apply(h, offs, ids, *(m.b_up for m in ex))
        y = _GroupedLinear.apply(F.gelu(h, approximate="tanh"), offs, 1, placeholders, *(m.w_down for m in ex))
        return y if ids is None else _GroupedBias.apply(y, offs, ids, *(m.b_down for m in ex))

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, selective: bool = False, recompute=None) -> torch.Tensor:
        """x: [s/t, b, h] (this TP rank's sequence shard, already normalised). `selective` and `recompute` are
        accepted for the MLP interface; the MoE keeps its activations."""
        shape = x.shape
        x2d = x.reshape(-1, self.hidden)
        T, k, E = x2d.size(0), self.top_k, self.num_experts
        topi, topv, aux = self.route(x2d)
        self.aux_loss = aux / self.tp

        flat_e = topi.reshape(-1)                                            # [T*k]
        flat_w = topv.reshape(-1)
        flat_t = torch.arange(T, device=x.device).repeat_interleave(k)
        if self.capacity_factor is not None:
            cap = int(math.ceil(self.capacity_factor * T * k / E))
            order = torch.argsort(flat_e, stable=True)
            se = flat_e[order]
            counts_all = _count_per_expert(se, E)
            starts = torch.cumsum(counts_all, 0) - counts_all
            pos = torch.arange(se.numel(), device=x.device) - starts[se]
            keep_sorted = pos < cap
            keep = torch.empty_like(keep_sorted)
            keep[order] = keep_sorted
            flat_e, flat_w, flat_t = flat_e[keep], flat_w[keep], flat_t[keep]
        # rows sorted by (dispatch chunk, expert): each chunk's rows contiguous, grouped by destination rank
        C = self.dispatch_chunks
        key = flat_e if C == 1 else (flat_t * C // T) * E + flat_e
        order = torch.argsort(key, stable=True)
        sorted_t = flat_t[order]
        counts = _count_per_expert(key[order], C * E)                      # [C * E] local rows per chunk, expert
        self.last_tokens_per_expert = (counts if C == 1 else counts.view(C, E).sum(0)).detach()
        # dropless: every (token, slot) pair is a row, so the rows' inverse order turns the gather's backward
        # and the combine into gathers and a sum over the k slots, without atomics or index sorting
        dropless = self.capacity_factor is None
        inv_order = _inverse(order) if dropless else None
        if dropless:
            tokens = _Gather.apply(x2d, sorted_t, inv_order, k)              # grouped by chunk, global expert
        else:
            tokens = x2d[sorted_t]

        shared = (lambda: self.shared(x2d)) if self.shared is not None else None
        if self.ep == 1:
            y = self._run_local_experts(tokens, counts)
            shared_out = shared() if shared is not None else None
        else:  # the shared experts run while the dispatch is in flight
            y, shared_out = self._dispatch_compute_combine(tokens, counts.view(C, E), shared)

        w = flat_w[order]
        if dropless:
            out = _Combine.apply(y.contiguous(), w, inv_order, sorted_t, k)
        else:
            out = torch.zeros_like(x2d, dtype=y.dtype).index_add(0, sorted_t, y * w.to(y.dtype).unsqueeze(-1))
        if shared_out is not None:
            out = out + shared_out.to(out.dtype)
        return out.to(x.dtype).view(shape)

    def _dispatch_compute_combine(self, tokens: torch.Tensor, counts: torch.Tensor, beside_dispatch=None):
        """tokens: this rank's rows grouped by (chunk, global expert), counts [C, E] rows per group. Each chunk
        goes to its experts' ranks by all-to-all, through the local experts and back. With C > 1 the transfers
        run beside the experts of the other chunk, forward and backward (_AllToAllStart / _AllToAllWait):
        chunk c + 1's dispatch beside chunk c's experts, chunk c's combine beside chunk c + 1's experts.
        beside_dispatch (the shared experts), when given, runs once every dispatch is out. Returns (rows back in
        `tokens`' order, beside_dispatch's result or None)."""
        ep, El, C = self.ep, self.local_experts, counts.size(0)
        # [dest rank, chunk, local expert] out, [source rank, chunk, local expert] in
        recv_counts = torch.empty(ep * C * El, dtype=counts.dtype, device=counts.device)
        dist.all_to_all_single(recv_counts, counts.view(C, ep, El).transpose(0, 1).contiguous().view(-1),
                               group=self.ep_group)
        rc = recv_counts.view(ep, C, El)
        local_counts = rc.sum(0)                                             # [C, El]
        # the layer's one host synchronisation: all_to_all_single takes its split sizes as lists
        sizes = torch.cat([counts.view(C, ep, El).sum(2).view(-1), rc.sum(2).t().reshape(-1),
                           local_counts.view(-1)]).tolist()
        send = [sizes[c * ep:(c + 1) * ep] for c in range(C)]
        recv = [sizes[(C + c) * ep:(C + c + 1) * ep] for c in range(C)]
        host_local = [sizes[2 * C * ep + c * El:2 * C * ep + (c + 1) * El] for c in range(C)]
        chunks = tokens.split([sum(sc) for sc in send])
        dispatched = []
        for c in range(C):  # every dispatch goes out first: the link works while the experts compute
            pending = _Pending()
            dispatched.append((_AllToAllStart.apply(chunks[c], recv[c], send[c], self.ep_group, pending), pending))
        beside = beside_dispatch() if beside_dispatch is not None else None
        outs = []
        for c, (rows, pending) in enumerate(dispatched):
            rows = _AllToAllWait.apply(rows, pending)
            perm_t = regroup_permutation(rc[:, c], sum(recv[c]))
            inv = _inverse(perm_t)
            y_local = self._run_local_experts(_Gather.apply(rows, perm_t, inv, 1), local_counts[c], host_local[c],
                                              placeholders=c == C - 1)
            back = _Gather.apply(y_local, inv, perm_t, 1)
            pending = _Pending()
            outs.append((_AllToAllStart.apply(back, send[c], recv[c], self.ep_group, pending), pending))
        ys = [_AllToAllWait.apply(y, pending) for y, pending in outs]
        return (ys[0] if C == 1 else torch.cat(ys)), beside


def _tensor_core_router(x: torch.Tensor, w: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16)


class _RouterLogits(torch.autograd.Function):
    """fp32 router logits x @ W^T. On CUDA with bf16 x and W one bf16 GEMM with an fp32 output: the same products,
    summed in fp32, as the fp32 GEMM of their upcast copies, without making those copies or keeping x's fp32
    copy for backward (it keeps x as it is). Why: the upcast operands ran on an fp32 (non-tensor-core) kernel,
    80 us a call at 8192 x 2048 x 8 on an H200 (session 12, s4's kernel table), and the kept fp32 copy was 4 bytes
    per hidden element per token. Backward likewise: the logits' gradient rounded to x's dtype (the rest of the
    backward runs in it) and both GEMMs on tensor cores summing in fp32; the weight gradient comes out in fp32
    before its cast. Through the upcast copies they were two fp32 GEMMs and an fp32 copy of x, about 4 ms of a
    232 ms MoE step (session 12). On CPU (the tests' fp32 models) everything stays fp32."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        if _tensor_core_router(x, w):
            return torch.ops.aten.mm.dtype(x, w.t(), torch.float32)
        return F.linear(x.float(), w.float())

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if _tensor_core_router(x, w):
            gl = g.to(x.dtype)
            return gl @ w, torch.ops.aten.mm.dtype(gl.t(), x, torch.float32).to(w.dtype)
        g = g.float()
        return (g @ w.float()).to(x.dtype), (g.t() @ x.float()).to(w.dtype)


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    """inv with inv[perm[i]] = i."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


class _Gather(torch.autograd.Function):
    """rows = x[src] where every row of x appears exactly k times in src, at the positions inv[k*r : k*r + k]
    (src = perm // k for a permutation perm of the k-fold repeated rows, inv its inverse). Backward gathers
    back and sums the k copies: autograd's backward of indexing accumulates with atomics after sorting."""

    @staticmethod
    def forward(ctx, x, src, inv, k):
        ctx.save_for_backward(inv)
        ctx.k = k
        return x.index_select(0, src)

    @staticmethod
    def backward(ctx, g):
        inv, = ctx.saved_tensors
        return gather_sum(g.contiguous(), inv, ctx.k), None, None, None


class _Combine(torch.autograd.Function):
    """The reverse of _Gather, weighted: out[r] = sum of the k rows of y that _Gather made from row r, each
    times its router weight w (runtime/moe_rows.py: one pass each way on CUDA)."""

    @staticmethod
    def forward(ctx, y, w, inv, src, k):
        ctx.save_for_backward(y, w, src)
        return gather_sum(y, inv, k, w)

    @staticmethod
    def backward(ctx, g):
        y, w, src = ctx.saved_tensors
        gy, gw = combine_backward(g.contiguous(), src, y, w)
        return gy, gw, None, None, None


def _count_per_expert(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """torch.bincount(ids, minlength=num_experts) without its host synchronisation (CUDA's bincount reads the
    largest id back to size its output; here the size is known)."""
    return ids.new_zeros(num_experts).scatter_add_(0, ids, torch.ones_like(ids))


def regroup_permutation(recv_counts: torch.Tensor, total: int) -> torch.Tensor:
    """Rows received by the dispatch all-to-all arrive ordered (source rank s, local expert e), with
    recv_counts[s, e] rows in each block; the experts want them ordered (e, s). Returns perm such that
    rows[perm] is in that order, keeping the order inside each block: a stable sort of every row by its
    target block e * ep + s, on the device (no per-token host work)."""
    ep, El = recv_counts.shape
    dev = recv_counts.device
    target = torch.arange(El, device=dev).view(1, El) * ep + torch.arange(ep, device=dev).view(ep, 1)
    keys = target.reshape(-1).repeat_interleave(recv_counts.reshape(-1), output_size=total)
    return torch.argsort(keys, stable=True)


def collect_aux_loss(module: nn.Module) -> torch.Tensor | None:
    """sum(aux_coeff * aux_loss) over every MoEMLP inside `module`, from their latest forward (None if
    the module has no MoE layer)."""
    total = None
    for m in module.modules():
        if isinstance(m, MoEMLP) and m.aux_loss is not None:
            term = m.aux_coeff * m.aux_loss
            total = term if total is None else total + term
    return total
