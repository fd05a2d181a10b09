"""Per MoE layer and micro-batch on one rank: the router, the local experts' grouped GEMMs per dispatch chunk and
the shared experts, calibrated by the expert efficiency, and the dispatch and combine all-to-alls with what of them
stays exposed beside the experts (MoeCosts; planner/cost/layer.py adds them to the layer)."""
from __future__ import annotations

from dataclasses import dataclass

from planner import memory as mem
from planner.cluster import place_group
from planner.cost.terms import BF16, exposed_s, two_chunk_exposed_s


def dispatch_remote_nodes(top_k: int, nodes: int, groups: int = 0, group_limit: int = 0) -> float:
    """Expected remote nodes one token is sent to when its top_k experts are routed uniformly over `nodes` nodes
    (each holding an equal share of the experts) and a per-node dispatch sends it once per destination node:
    distinct nodes D = nodes x (1 - (1 - 1/nodes)^top_k), of which (nodes - 1)/nodes are not the token's own node
    (by symmetry). A group-limited router (the experts in `groups` contiguous groups, a token's experts from at
    most `group_limit` of them; 0: no limit) caps D at group_limit x max(1, nodes / groups) nodes: a group lies
    on nodes / groups nodes when the EP group spans more nodes than groups, else inside one node. E.g. top 8 over
    8 nodes: D = 5.25, 4.59 remote; 4 of 8 groups: at most 4 nodes, 3.5 remote; against 7 of the 8 copies
    remote for a plain all-to-all."""
    if nodes <= 1:
        return 0.0
    distinct = nodes * (1 - (1 - 1 / nodes) ** top_k)
    if groups > 0 and group_limit > 0:
        distinct = min(distinct, group_limit * max(1.0, nodes / groups))
    return distinct * (nodes - 1) / nodes


@dataclass(frozen=True)
class MoeCosts:
    """The routed experts of one MoE layer on one rank (MoeTerms._moe_s); all 0 for a dense layer."""
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    all_to_all_s: float = 0.0
    """One dispatch (or combine) all-to-all, calibrated."""
    ep_fraction: float = 0.0
    """The share of the all-to-alls hidden beside compute (one dispatch chunk)."""
    comm_ep_s: float = 0.0
    """Exposed forward + backward all-to-all time beside the experts."""


class MoeTerms:
    """LayerTerms' MoE part: needs m, lay, cluster, prof, target, tokens, dispatch_chunks, stacks_expert_weights,
    _ep_beside_layer, group_collective_s, strides, _network_fit, _moe_row_passes_s and _gemm_fwd_bwd_s."""

    @property
    def expert_gemm_rows(self) -> int:
        """Rows each local expert's GEMM takes per dispatch chunk, on average: this rank's routed token copies
        (tokens x top_k) times the EP degree (the EP group's tokens reach this rank's experts) over the experts,
        e.g. Qwen3-30B-A3B (128 experts, top 8) at 4096 tokens: 256 at EP 1, 512 at EP 2, 2048 at EP 8. At least
        one row (fewer copies than experts: priced as if each expert had one)."""
        m, lay = self.m, self.lay
        routed = self.tokens / lay.tp * m.top_k
        return max(1, round(routed * lay.ep / m.num_experts / self.dispatch_chunks))

    def _ep_all_to_all_s(self, tokens: float, chunks: int) -> float:
        """One all-to-all of the MoE dispatch (or combine) of one of `chunks` chunks of this rank's `tokens`
        tokens, each to top_k experts spread over the EP group. A plain all-to-all moves every routed copy
        (tokens x top_k x hidden, bf16) and the group's placement prices it (CommTerms.group_collective_s). With
        the target's per-node dispatch (RuntimeTarget.ep_dispatch_per_node: DeepEP, DeepSeek-V3's kernels) a token
        crosses the network once per remote destination node (dispatch_remote_nodes) and the node's NVLink carries
        its copies to the GPUs that hold its experts, (g - 1)/g of the routed copies for g ranks of the group per
        node; the two pipeline against each other (the slower bounds) and their latencies add, as
        physics.spanning_s prices an all-to-all spanning nodes."""
        m, lay = self.m, self.lay
        routed_bytes = BF16 * (tokens * m.top_k) * m.hidden / chunks
        place = place_group(self.cluster, lay.ep, self.strides["ep"])
        if not self.target.ep_dispatch_per_node or place.link == "nvlink" or place.ranks_per_node <= 1:
            return self.group_collective_s("all_to_all", routed_bytes, lay.ep, self.strides["ep"])
        g = place.ranks_per_node
        nodes = max(lay.ep // g, 2)
        net = self._network_fit("all_to_all", nodes)
        intra = self.prof.collective("all_to_all", g, "nvlink")
        remote = dispatch_remote_nodes(m.top_k, nodes, self.target.ep_route_groups, self.target.ep_group_limit)
        net_bytes = BF16 * tokens / chunks * m.hidden * remote
        t_net = net_bytes / net.bus_bandwidth_bytes_per_s
        t_intra = routed_bytes * (g - 1) / g / intra.bus_bandwidth_bytes_per_s
        return intra.latency_s + net.latency_s + max(t_net, t_intra)

    def _grouped_gemm_fwd_bwd_s(self, experts: int, rows: int, n: int, k: int) -> tuple[float, float]:
        """(forward, backward) seconds of one grouped GEMM of `experts` experts of `rows` rows each, [rows,k]x[k,n]
        per expert, as runtime/parallel/expert_mlp.py runs it (torch._grouped_mm: one kernel per projection and
        direction, forward, dgrad and wgrad, over all the local experts). Where the profile measured grouped
        GEMMs (Profile.grouped_gemm_s): the measured grouped-over-dense ratio at these rows per expert times the
        dense GEMM of all experts x rows rows. Else (a profile without grouped GEMMs): each expert's GEMM at its own small M from
        the GEMM tables, times the experts, one launch per call; that overstates few rows per expert several
        times over (a grouped kernel fills the GPU with several experts' tiles at once), as plans say."""
        fp8 = self.lay.fp8 and self.target.fp8_experts
        tables = {"fwd": "fp8" if fp8 else None, "dgrad": "fp8" if fp8 else None,
                  "wgrad": "fp8" if fp8 and self.target.fp8_wgrad else None}

        def g(d):  # the profile's grouped GEMM, as the target's runtime runs it
            t = self.prof.grouped_gemm_s(d, experts, rows, n, k, tables[d])
            return None if t is None else self.target.gemm_s(tables[d] or "mm", t)
        fwd, dgrad, wgrad = (g(d) for d in ("fwd", "dgrad", "wgrad"))
        if fwd is not None and dgrad is not None and wgrad is not None:
            return fwd, dgrad + wgrad
        launch = self.prof.gemm_launch_s
        f1, b1 = self._gemm_fwd_bwd_s(rows, n, k, fp8=fp8)
        return experts * (f1 - launch) + launch, experts * (b1 - 2 * launch) + 2 * launch

    def _moe_s(self) -> MoeCosts:
        """The routed experts of an MoE layer on this rank (router GEMM, grouped expert GEMMs per dispatch chunk,
        the stacking of their weights, the row passes around them), calibrated by the expert efficiency, and the
        dispatch and combine all-to-alls with what of them stays exposed beside the experts."""
        m, lay, prof = self.m, self.lay, self.prof
        t, h, f = lay.tp, m.hidden, m.ffn_hidden
        tok_t = int(self.tokens) / t
        routed = tok_t * m.top_k  # token copies per rank after dispatch (on average, whatever the EP degree)
        chunks = self.dispatch_chunks  # the experts run once per chunk, on its share of the rows
        rf, rb = self._gemm_fwd_bwd_s(int(tok_t), m.num_experts, h)
        # the local experts run as grouped GEMMs, each at the rows its experts receive (expert_gemm_rows)
        local = m.num_experts // lay.ep
        rows = self.expert_gemm_rows
        e1f, e1b = (chunks * x for x in self._grouped_gemm_fwd_bwd_s(local, rows, (2 if m.gated_mlp else 1) * f, h))
        e2f, e2b = (chunks * x for x in self._grouped_gemm_fwd_bwd_s(local, rows, h, f))
        # the grouped GEMMs take the local experts' weights as one [experts, out, in] tensor: a view of the
        # flat parameter buffer, where runtime/parallel/data_parallel.py lays each projection's expert weights out back
        # to back (sharding 'none' and 'optimizer'); else (ZeRO-2 may cut them, FSDP owns its own storage)
        # _GroupedLinear stacks a copy in forward and again in backward: a read and a write of every local
        # expert weight (bf16) each way, per micro-batch
        stack_s = prof.memory_bound_s(2 * BF16 * mem.layer_expert_params_local(m, lay.ep)) \
            if self.stacks_expert_weights else 0.0
        rows_f_s, rows_b_s = self._moe_row_passes_s(tok_t, routed, h, lay.ep > 1)
        xe = self.target.kernel_s(prof.eff("expert")) * self.target.expert_factor
        moe_f = (rf + e1f + e2f + stack_s + rows_f_s) * xe
        moe_b = (rb + e1b + e2b + stack_s + rows_b_s) * xe
        # dispatch and combine all-to-alls, each way in forward and again in backward
        a2a = self._ep_all_to_all_s(tok_t, chunks) * prof.eff("ep")
        ep_frac, comm_ep = 0.0, 0.0
        if chunks == 1:
            ep_frac = self.target.ep_fraction(prof.overlap_hidden_fraction.get("ep", 0.0))
            if not self._ep_beside_layer:  # the dispatch not overlapped: behind the experts at most
                if self.target.ep_hidden_without_overlap is not None:
                    ep_frac = self.target.ep_hidden_without_overlap
                comm_ep = 4 * exposed_s(a2a, (moe_f + moe_b) / 4, ep_frac, True)
        else:  # each chunk's transfers beside the other chunk's experts: the schedule's own timeline
            experts_f, experts_b = (e1f + e2f) / chunks * xe, (e1b + e2b) / chunks * xe
            comm_ep = two_chunk_exposed_s(a2a, experts_f) + two_chunk_exposed_s(a2a, experts_b)
        return MoeCosts(moe_f, moe_b, a2a, ep_frac, comm_ep)

    def _with_shared_experts_s(self, fwd: float, bwd: float, ew_f: float, ew_b: float) -> tuple[float, ...]:
        """(fwd, bwd, ew_f, ew_b) with the shared experts added (runtime/parallel/expert.py, SharedExperts): a bf16
        SwiGLU MLP over this rank's sequence shard, whole on every TP rank; Qwen's gate is a [hidden] dot product
        and a scaling pass. The runtime runs them while the dispatch is in flight; no overlap is credited (not
        measured)."""
        m, prof = self.m, self.prof
        h, fs = m.hidden, m.shared_expert_ffn
        tok_t = int(self.tokens) / self.lay.tp
        k = prof.kernel_s
        for shape in ((int(tok_t), 2 * fs, h), (int(tok_t), h, fs)):
            a_s, b_s = self._gemm_fwd_bwd_s(*shape)
            fwd, bwd = fwd + a_s, bwd + b_s
        ew_f += k("swiglu_fwd", BF16 * 3 * tok_t * fs)
        ew_b += k("swiglu_bwd", BF16 * 5 * tok_t * fs)
        if m.shared_expert_gate:
            ew_f += prof.memory_bound_s(BF16 * 3 * tok_t * h)
            ew_b += prof.memory_bound_s(BF16 * 5 * tok_t * h)
        return fwd, bwd, ew_f, ew_b
