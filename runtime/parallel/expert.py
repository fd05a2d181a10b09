"""Expert parallelism: a Mixtral/Qwen-style MoE MLP with all-to-all token dispatch over the EP group.

Layout of the weights
  * Router: `router.weight` [num_experts, hidden], no bias, replicated on every rank (not an expert param).
  * Experts: `num_experts / ep` local experts per rank, rank `ep_rank` of the EP group owning global experts
    [ep_rank * E_local, (ep_rank + 1) * E_local), stored as `experts.<global index>.{w_gate,w_up,w_down}`
    (SwiGLU, no bias) for Llama-family specs, or `{w_up,b_up,w_down,b_down}` (GELU) for GPT-family specs:
    exactly `ModelSpec.expert_params()` per expert, `mlp_params()` per layer at EP1. Parameter names
    carry the global expert index, so init (seeded by name) and checkpoints do not depend on EP.
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
e, both over this rank's local tokens. After each forward `self.aux_loss` holds it (a tensor in the graph)
divided by the TP degree (so that summing gradients over TP gives the mean over the sequence shards). The
training loop adds it to each micro-batch's loss, scaled to a mean over micro-batches and dp*cp ranks
since gradients are summed over both:
    loss = loss_sum / global_label_count + collect_aux_loss(stage) / (num_micro_batches * dp * cp)
(`collect_aux_loss` multiplies by each layer's `aux_coeff`). It must be collected right after the
forward that produced it (a later forward, or a recompute, replaces the attribute).

Dispatch: dropless by default (every assignment computed); with `capacity_factor` set, each expert takes at
most ceil(capacity_factor * tokens * k / E) assignments per rank-local batch, in token order, and the
rest are dropped (they contribute zero; the other slots keep their weights). Assignments are sorted by
expert, the counts exchanged with one small all_to_all, the tokens sent with all_to_all_single with
variable splits, regrouped by local expert, computed, and sent back the same way.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from planner.model import ModelSpec

__all__ = ["MoEMLP", "collect_aux_loss", "all_to_all_single_autograd"]


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.group, ctx.out_splits, ctx.in_splits = group, out_splits, in_splits
        x = x.contiguous()
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        out = g.new_empty((sum(ctx.in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(out, g, ctx.in_splits, ctx.out_splits, group=ctx.group)
        return out, None, None, None


def all_to_all_single_autograd(x, out_splits: list[int], in_splits: list[int], group):
    """all_to_all_single along dim 0 with variable splits; backward is the reverse all-to-all."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


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
        if self.gated:
            return F.linear(F.silu(F.linear(x, self.w_gate)) * F.linear(x, self.w_up), self.w_down)
        return F.linear(F.gelu(F.linear(x, self.w_up, self.b_up), approximate="tanh"), self.w_down, self.b_down)


def _param(shape, init):
    """A parameter with the metadata runtime.parallel.tensor gives its own (replicated over TP: tp_dim None;
    sequence_parallel: gradients are partial sums per TP rank) plus expert = True."""
    p = nn.Parameter(torch.empty(shape))
    p.tp_dim, p.tp_parts, p.init, p.sequence_parallel = None, None, init, True
    p.expert = True
    return p


class MoEMLP(nn.Module):
    """Drop-in for runtime.model.MLP: forward(x, norm=None, selective=False) with x [s/t, b, h] (any
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
        self.aux_groups = 1
        """The load-balancing loss is the mean of the losses of this many equal, contiguous chunks of the
        rank's tokens (in [s, b, h] order: sequence chunks). 1 in training; a single-process reference of a
        TP t run sets t to reproduce the per-TP-rank (sequence-shard) losses exactly."""
        self.aux_loss: torch.Tensor | None = None
        self.last_tokens_per_expert: torch.Tensor | None = None
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
        logits = F.linear(x2d.float(), self.router.weight.float())
        probs = torch.softmax(logits, dim=-1)
        topv, topi = probs.topk(self.top_k, dim=-1)
        if self.normalize_topk:
            topv = topv / topv.sum(-1, keepdim=True)
        E = self.num_experts
        mask = F.one_hot(topi, E).to(probs.dtype)          # [T, k, E]
        g = self.aux_groups
        T = probs.size(0)
        tokens_per_expert = mask.view(g, T // g, *mask.shape[1:]).mean(1)   # [g, k, E]
        prob_per_expert = probs.view(g, T // g, E).mean(1)                  # [g, E]
        aux = E * (tokens_per_expert * prob_per_expert.unsqueeze(1)).sum() / g
        return topi, topv, aux

    # -- experts -----------------------------------------------------------------------------------
    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert e (global index expert_offset + e)."""
        return self.experts[str(self.expert_offset + e)](x)

    def _run_local_experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x holds rows grouped by local expert, counts[e] rows for local expert e. Every expert runs, on
        zero rows if it got none, so every expert parameter always receives a gradient (possibly zero):
        bucketed gradient hooks in the data-parallel code then fire on every rank."""
        outs = []
        start = 0
        for e, n in enumerate(counts):
            outs.append(self._expert(e, x[start:start + n]))
            start += n
        return torch.cat(outs, 0)

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, norm=None, selective: bool = False) -> torch.Tensor:
        """x: [s/t, b, h] (this TP rank's sequence shard); norm: the pre-MLP norm to apply first (None for
        post-norm BERT). `selective` is accepted for the MLP interface; the MoE keeps its activations."""
        if norm is not None:
            x = norm(x)
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
            counts_all = torch.bincount(se, minlength=E)
            starts = torch.cumsum(counts_all, 0) - counts_all
            pos = torch.arange(se.numel(), device=x.device) - starts[se]
            keep_sorted = pos < cap
            keep = torch.empty_like(keep_sorted)
            keep[order] = keep_sorted
            flat_e, flat_w, flat_t = flat_e[keep], flat_w[keep], flat_t[keep]
        order = torch.argsort(flat_e, stable=True)
        sorted_e = flat_e[order]
        sorted_t = flat_t[order]
        counts = torch.bincount(sorted_e, minlength=E)                     # [E] local assignments per expert
        self.last_tokens_per_expert = counts.detach()
        tokens = x2d[sorted_t]                                               # grouped by global expert

        if self.ep == 1:
            y = self._run_local_experts(tokens, counts.tolist())
        else:
            El = self.local_experts
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.ep_group)  # [ep * El]: from src s, expert e
            send_counts = counts.view(self.ep, El).sum(1).tolist()
            rc = recv_counts.view(self.ep, El)
            recv_split = rc.sum(1).tolist()
            recv = all_to_all_single_autograd(tokens, recv_split, send_counts, self.ep_group)
            perm_t = regroup_permutation(rc, sum(recv_split))
            local_counts = rc.sum(0).tolist()
            y_local = self._run_local_experts(recv[perm_t], local_counts)
            inv = torch.empty_like(perm_t)
            inv[perm_t] = torch.arange(perm_t.numel(), device=x.device)
            back = y_local[inv]
            y = all_to_all_single_autograd(back, send_counts, recv_split, self.ep_group)

        w = flat_w[order].to(y.dtype).unsqueeze(-1)
        out = torch.zeros_like(x2d, dtype=y.dtype).index_add(0, sorted_t, y * w)
        return out.to(x.dtype).view(shape)


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
