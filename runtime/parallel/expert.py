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

Gradient reduction (runtime.parallel.data_parallel does this; the loss convention there is "sum over dp*cp")
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

Routing and the load-balancing loss: runtime/parallel/router.py. The experts, looped or as grouped GEMMs:
runtime/parallel/expert_mlp.py. The row gathers, the all-to-all dispatch and the weighted combine:
runtime/parallel/expert_dispatch.py. This file holds the layer that ties them together (MoEMLP) and
`collect_aux_loss`.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from planner.model import ModelSpec
from runtime.parallel.expert_dispatch import (Combine, Gather, count_per_expert, dispatch_compute_combine,
                                              inverse)
from runtime.parallel.expert_mlp import (Expert, SharedExperts, grouped_experts, grouped_mm_supported,
                                         looped_experts)
from runtime.parallel.router import route

__all__ = ["MoEMLP", "collect_aux_loss", "grouped_mm_supported"]


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
        # back (runtime/parallel/data_parallel.py): the grouped GEMMs take them, and their gradients, as one view
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
        """Returns (expert ids [T, k], weights [T, k] fp32, aux loss) (runtime/parallel/router.py)."""
        return route(x2d, self.router.weight, self.top_k, self.normalize_topk, self.seq_group)

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
        local = list(self.experts.values())  # local experts in order (global index expert_offset + e)
        if self.use_grouped_mm(x):
            return grouped_experts(local, x, counts, self.spec.gated_mlp, placeholders)
        return looped_experts(local, x, counts.tolist() if host_counts is None else host_counts)

    def use_grouped_mm(self, x: torch.Tensor) -> bool:
        """The path for rows x: `self.grouped_mm` where set, else what grouped_mm_supported says."""
        if self.grouped_mm is not None:
            return self.grouped_mm
        return grouped_mm_supported(x, self.hidden, self.ffn)

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
            counts_all = count_per_expert(se, E)
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
        counts = count_per_expert(key[order], C * E)                       # [C * E] local rows per chunk, expert
        self.last_tokens_per_expert = (counts if C == 1 else counts.view(C, E).sum(0)).detach()
        # dropless: every (token, slot) pair is a row, so the rows' inverse order turns the gather's backward
        # and the combine into gathers and a sum over the k slots, without atomics or index sorting
        dropless = self.capacity_factor is None
        inv_order = inverse(order) if dropless else None
        if dropless:
            tokens = Gather.apply(x2d, sorted_t, inv_order, k)               # grouped by chunk, global expert
        else:
            tokens = x2d[sorted_t]

        shared = (lambda: self.shared(x2d)) if self.shared is not None else None
        if self.ep == 1:
            y = self._run_local_experts(tokens, counts)
            shared_out = shared() if shared is not None else None
        else:  # the shared experts run while the dispatch is in flight
            y, shared_out = dispatch_compute_combine(tokens, counts.view(C, E), self.ep_group, self.ep,
                                                     self.local_experts, self._run_local_experts, shared)

        w = flat_w[order]
        if dropless:
            out = Combine.apply(y.contiguous(), w, inv_order, sorted_t, k)
        else:
            out = torch.zeros_like(x2d, dtype=y.dtype).index_add(0, sorted_t, y * w.to(y.dtype).unsqueeze(-1))
        if shared_out is not None:
            out = out + shared_out.to(out.dtype)
        return out.to(x.dtype).view(shape)


def collect_aux_loss(module: nn.Module) -> torch.Tensor | None:
    """sum(aux_coeff * aux_loss) over every MoEMLP inside `module`, from their latest forward (None if
    the module has no MoE layer)."""
    total = None
    for m in module.modules():
        if isinstance(m, MoEMLP) and m.aux_loss is not None:
            term = m.aux_coeff * m.aux_loss
            total = term if total is None else total + term
    return total
