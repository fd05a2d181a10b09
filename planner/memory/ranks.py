"""Memory per rank: parameters, gradients, optimizer states and activations of the stages a rank holds, and the
lower bound the search prunes with."""
from __future__ import annotations

from planner import memory as mem
from planner.cost.terms import MemoryTerms, cached_property
from planner.memory.in_flight import ranks_at_scarcest_peak
from planner.plan import StagePlan


class MemoryTermsOfRanks:
    """CostModel's parameter counts and per-rank memory."""

    @cached_property
    def per_layer_params(self) -> tuple[float, float]:
        """(dense, expert) parameter elements of one layer on one rank."""
        return self._memo("per_layer_params", lambda: (mem.layer_dense_params_local(self.m, self.lay.tp),
                                                       mem.layer_expert_params_local(self.m, self.lay.ep)))

    @cached_property
    def zero2_full_grads(self) -> bool:
        """Whether each pipeline rank holds its whole full-size gradient under ZeRO-2 (memory.zero2_holds_full_grads)."""
        return mem.zero2_holds_full_grads(self.lay, self.num_micro)

    @cached_property
    def fsdp_grads_at_peak(self) -> bool:
        """Whether the step's sharded gradients are alive at the rank's peak (memory.fsdp_holds_grads_at_peak)."""
        return mem.fsdp_holds_grads_at_peak(self.lay, self.num_micro)

    def state_of(self, dense: float, expert: float) -> float:
        """Persistent bytes of `dense` and `expert` parameter elements at the rank's peak (memory.state_bytes)."""
        return mem.state_bytes(dense, expert, self.lay, self.target.expert_states_over_tp, self.zero2_full_grads,
                               self.fsdp_grads_at_peak, storage=self.target.state_storage)

    def rank_params(self, rank_stages: list[tuple[int, StagePlan]]) -> tuple[float, float]:
        """(dense, expert) parameter elements held by one pipeline rank."""
        layers = sum(st.layers for _, st in rank_stages)
        first = any(j == 0 for j, _ in rank_stages)
        last = any(j == self.lay.pp * self.lay.vpp - 1 for j, _ in rank_stages)
        return self.params_of(layers, first, last)

    def params_of(self, layers: float, first: bool, last: bool) -> tuple[float, float]:
        m, lay = self.m, self.lay
        dense_l, expert_l = self.per_layer_params
        dense = layers * dense_l
        if first:
            dense += mem.embedding_params_local(m, lay.tp)
        if last:
            dense += mem.head_params_local(m, lay.tp, lay.pp)
        return dense, layers * expert_l

    def rank_memory_bytes(self, rank: int, rank_stages: list[tuple[int, StagePlan]], num_micro: int) -> float:
        """Peak bytes of one pipeline rank: states + the activations of the micro-batches its chunks hold at once
        at the schedule's peak (PipelineSchedule.in_flight_peaks) + the largest transient (a layer's backward working set,
        the output layer's logits, a fully recomputed layer's rematerialised activations). Under
        'optimizer+grads' the in-flight full-size gradient buckets sit beside the activations during every
        backward, so they add to this peak. ZeRO-1 reduces in place, so it has no second, end-of-backward peak
        of reduce-scatter outputs (memory.dp_reduction_transient_bytes). Under 'full' FSDP2's gathered weights
        (memory.fsdp_gather_bytes) are held throughout and its reduction (memory.fsdp_reduce_bytes) beside a
        layer's backward, net of the activations freed before it (fsdp_backward_bytes)."""
        static, per_mb = self.rank_memory_parts(rank_stages)
        return static + mem.peak_in_flight_bytes(self.in_flight_peaks(rank, num_micro), per_mb)

    def rank_memory_parts(self, rank_stages: list[tuple[int, StagePlan]]) -> tuple[float, list[float]]:
        """rank_memory_bytes in two parts: (bytes held whatever the schedule's moment (states, workspaces, the
        largest transient), bytes each of the rank's chunks keeps per micro-batch in flight)."""
        m, lay, shape = self.m, self.lay, self.shape
        dense, expert = self.rank_params(rank_stages)
        first = any(j == 0 for j, _ in rank_stages)
        last = lay.pp * lay.vpp - 1
        holds_head = any(j == last for j, _ in rank_stages)
        root = (mem.embedding_params_local(m, lay.tp) if first else 0.0) \
            + (mem.head_params_local(m, lay.tp, lay.pp) if holds_head else 0.0)
        base = self.state_of(dense, expert) + mem.fsdp_gather_bytes(m, lay, root) \
            + mem.cublas_workspace_bytes(lay, self.cluster.gpu)
        acts = self.activations
        head_kept, head_transient = mem.head_activation_bytes(m, shape, lay)
        dp_t = mem.dp_reduction_transient_bytes(dense, expert, lay, mem.largest_layer_param_local(m, lay.tp),
                                                mem.largest_param_local(m, lay.tp), full_grads=self.zero2_full_grads)
        # beside a layer's backward: ZeRO-2's buckets (nothing under 'none' and 'optimizer'), FSDP2's reduction
        beside = dp_t + self.fsdp_backward_bytes(rank_stages, head_kept)
        transient = acts.working_bytes + beside
        per_chunk = []
        for j, st in rank_stages:
            n_none = st.layers - st.full_recompute_layers - st.selective_recompute_layers
            per_mb = n_none * acts.none_bytes + st.selective_recompute_layers * acts.selective_bytes \
                + st.full_recompute_layers * acts.full_bytes
            per_mb += mem.rotary_table_bytes(m, shape, lay)
            if j != last:
                per_mb += mem.pipeline_output_bytes(m, shape, lay)
            if j == 0:
                per_mb += mem.embedding_activation_bytes(m, shape, lay)
            if j == last:
                per_mb += head_kept
                transient = max(transient, head_transient)
            if st.full_recompute_layers:
                transient = max(transient, acts.working_bytes + acts.none_bytes + beside)
            per_chunk.append(per_mb)
        return base + transient, per_chunk

    def fsdp_backward_bytes(self, rank_stages: list[tuple[int, StagePlan]], head_kept: float) -> float:
        """What FSDP2 holds beside a layer's backward under 'full' beyond the gathered weights, net of the
        activations freed before it, the largest over the rank's chunks (0 under the other levels). In a chunk's
        backward the previous layer's reduce-scatter (memory.fsdp_reduce_bytes) follows that layer's backward, whose
        activations are then gone, and on the last stage the head's kept tensors too, while the output layer's
        gradient (memory.fsdp_head_grad_bytes) stays; by the end of the layer's own backward its unsharded
        gradients (memory.fsdp_layer_grad_bytes) have replaced its activations as well. A layer's activations are
        the least any of the chunk's layers keeps (its recompute mode's; a full-recompute layer's where the chunk's
        layers are not given). Never below 0: other moments (the head's backward, the forward) hold the
        activations and the gathered weights without these."""
        m, lay, acts = self.m, self.lay, self.activations
        if lay.sharding != "full":
            return 0.0
        reduce = mem.fsdp_reduce_bytes(m, lay, self.fsdp_grads_at_peak)
        layer_grads = mem.fsdp_layer_grad_bytes(m, lay)
        head_net = mem.fsdp_head_grad_bytes(m, lay) - head_kept
        last = lay.pp * lay.vpp - 1
        worst = 0.0
        for j, st in rank_stages:
            n_none = st.layers - st.full_recompute_layers - st.selective_recompute_layers
            kept = min((b for n, b in ((st.full_recompute_layers, acts.full_bytes),
                                       (st.selective_recompute_layers, acts.selective_bytes),
                                       (n_none, acts.none_bytes)) if n > 0), default=acts.full_bytes)
            net = reduce - kept + max(0.0, layer_grads - kept) + (head_net if j == last else 0.0)
            worst = max(worst, net)
        return worst

    def memory_lower_bound_bytes(self, per_layer_act_bytes: float, extra_transient_bytes: float = 0.0) -> float:
        """A lower bound of the busiest rank's rank_memory_bytes over every layer split, with each layer keeping at
        least per_layer_act_bytes per micro-batch in flight (the least its recompute choices allow). Each rank r
        holds fixed bytes F_r that no split moves (workspace, the smallest transient, its chunks' per-micro-batch
        tensors, the embedding or head where it sits), and per layer w_r = state + activations times the fewest
        micro-batches any of its chunks holds at one moment of the schedule (rank_fixed_bytes). The continuous relaxation spreads the L layers so that
        every rank holding any reaches the same M: sum_r max(0, M - F_r) / w_r = L. extra_transient_bytes: a
        transient every rank has for the recompute assumed (a fully recomputed layer's rematerialised activations)."""
        state_l, ranks = self.rank_fixed_bytes
        fixed = [f + max(transient + extra_transient_bytes, own_transient) for f, transient, own_transient, _ in ranks]
        weight = [state_l + per_layer_act_bytes * k for _, _, _, k in ranks]
        # the smallest M: add ranks in order of F_r while M stays above the next one's F
        order = sorted(range(len(ranks)), key=fixed.__getitem__)
        inv = fixed_over_w = 0.0
        M = fixed[order[0]]
        for i, r in enumerate(order):
            inv += 1.0 / weight[r]
            fixed_over_w += fixed[r] / weight[r]
            M = (self.m.num_layers + fixed_over_w) / inv
            if i + 1 == len(order) or M <= fixed[order[i + 1]]:
                break
        return M

    @cached_property
    def rank_fixed_bytes(self) -> tuple[float, list[tuple[float, float, float, int]]]:
        """(state bytes per layer, per rank (bytes no split moves, the transient every rank has, this rank's own
        transient (the logits, on the last stage's rank), the fewest micro-batches any of its chunks holds at one
        moment of the schedule)) for memory_lower_bound_bytes; worked out once per layout."""
        m, lay, shape = self.m, self.lay, self.shape
        num_micro = self.num_micro
        S = lay.pp * lay.vpp
        state_l = self.state_of(*self.per_layer_params)
        transient = self.activations.working_bytes + mem.dp_reduction_transient_bytes(
            0.0, 0.0, lay, mem.largest_layer_param_local(m, lay.tp), mem.largest_param_local(m, lay.tp))
        every_mb = mem.rotary_table_bytes(m, shape, lay)
        hop_mb = mem.pipeline_output_bytes(m, shape, lay)
        head_kept, head_transient = mem.head_activation_bytes(m, shape, lay)
        workspace = mem.cublas_workspace_bytes(lay, self.cluster.gpu)
        embedding_mb = mem.embedding_activation_bytes(m, shape, lay)
        # (first, last) -> a rank's bytes before its chunks' (the same on every rank between the ends)
        no_layer: dict[tuple[bool, bool], float] = {}
        ranks = []
        for chunks, inflight, first, last in ranks_at_scarcest_peak(self.schedule, lay.pp, lay.vpp, num_micro):
            f = no_layer.get((first, last))
            if f is None:
                dense, expert = self.params_of(0, first, last)
                f = no_layer[(first, last)] = self.state_of(dense, expert) + mem.fsdp_gather_bytes(m, lay, dense) \
                    + workspace
            for j, k in zip(chunks, inflight):
                per_mb = every_mb + (hop_mb if j != S - 1 else head_kept)
                if j == 0:
                    per_mb += embedding_mb
                f += k * per_mb
            ranks.append((f, transient, head_transient if last else 0.0, min(inflight)))
        return state_l, ranks

    def memory_terms(self, rank: int, num_micro: int) -> "MemoryTerms":
        """Rank memory as the largest of linear functions of its stages' layer and recompute counts, one per
        moment that can be the schedule's peak (what CP-SAT and the greedy split use; MemoryTerms), with a_none
        more if any layer is fully recomputed (its rematerialised activations during backward) (see
        rank_memory_bytes). Under 'full' the layers' activations freed before FSDP2's reduction are counted at
        the least a layer keeps (fsdp_backward_bytes without the stages' recompute), so these terms never fall below
        rank_memory_bytes."""
        js = self.rank_chunks(rank)
        acts = self.activations
        dense_l, expert_l = self.per_layer_params
        static, fixed = self.rank_memory_parts([(j, StagePlan(0)) for j in js])
        state_l = self.state_of(dense_l, expert_l)
        return MemoryTerms(
            base_bytes=static, state_per_layer_bytes=state_l, peaks=self.in_flight_peaks(rank, num_micro),
            fixed_per_mb_bytes=fixed,
            none_bytes=acts.none_bytes, sel_saving_bytes=acts.none_bytes - acts.selective_bytes,
            full_saving_bytes=acts.none_bytes - acts.full_bytes)
