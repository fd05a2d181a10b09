"""The host floor: the time the CPU takes to issue a stage's kernels, per layer kind and parallel dimension."""
from __future__ import annotations

from planner.cost.terms import cached_property
from planner.plan import StagePlan


class HostTerms:
    """CostModel's host (kernel-issue) times per stage."""

    def stage_expert_host_s(self, st: StagePlan) -> float:
        """The part of stage_host_s that adds to the GPU time instead of running under it: at EP > 1 routing
        synchronises the host with the GPU every MoE layer (runtime/parallel/expert.py reads the all-to-all
        split sizes with one .tolist()), so the MoE layer's host time (profile.host.moe_layer_s) comes after
        the GPU has caught up. At EP1 the grouped experts keep their counts on the device:
        no synchronisation, the host time is a floor like a dense layer's, and this is 0."""
        host, m, lay = self.prof.host, self.m, self.lay
        if host is None or not m.is_moe or lay.ep == 1 or self.target.own_host_model:
            return 0.0
        return st.layers * (host.moe_layer_s() + self.extra_chunk_host_s) * self.prof.eff("host")


    @cached_property
    def host_per_layer_s(self) -> dict:
        """Host time to issue one layer, by recompute mode (profile.host, its figures of the model's family or of
        the measured family it names, ModelFamily.host_key; the search asks for it per stage and split, so it is
        worked out once per layout)."""
        host, lay, m = self.prof.host, self.lay, self.m
        data_parallel = lay.dp * lay.cp > 1
        key = ("host per layer", lay.tp, lay.cp, lay.sharding, lay.ep, data_parallel, self.dispatch_chunks)
        v = self._shared.get(key)
        if v is None:
            v = self._shared[key] = {
                mode: host.layer_host_s(mode, lay.tp, lay.cp, lay.sharding, m.is_moe, lay.ep, m.model_family.host_key,
                                        self.prof.eff("host_tp"), self.prof.eff("host_cp"), data_parallel)
                + self.extra_chunk_host_s for mode in ("none", "selective", "full")}
        return v

    @property
    def extra_chunk_host_s(self) -> float:
        """Host time per MoE layer of a second dispatch chunk (Layout.overlap_ep): it issues its transfers and
        experts after the same synchronisation, modelled as EP's host time once more (not measured)."""
        return (self.dispatch_chunks - 1) * self.prof.host.ep_extra_s

    def stage_host_s(self, j: int, st: StagePlan) -> float:
        """Host time to issue one micro-batch through virtual stage j (profile.host; 0 without it): its
        layers, a chunk's sends and schedule under pipelining, and on the last stage the rest of the
        micro-batch (embedding, head, loss). 0 for a CUDA-graph step (Layout.cuda_graph): the host launches the
        captured step once, and that launch (tens of microseconds) is left out."""
        host = self.prof.host
        if self.lay.cuda_graph:
            return 0.0
        if self.target.own_host_model:  # the target's stated figure (planner/cost/targets.py), not our runtime's
            return self.target.stage_host_s(st.layers, st.full_recompute_layers)
        if host is None:
            return 0.0
        lay, m = self.lay, self.m
        per_layer = self.host_per_layer_s
        none = st.layers - st.full_recompute_layers - st.selective_recompute_layers
        t = none * per_layer["none"] + st.full_recompute_layers * per_layer["full"] \
            + st.selective_recompute_layers * per_layer["selective"]
        if j == lay.pp * lay.vpp - 1:
            t += host.micro_batch_ends_s(m.model_family.host_key, lay.dp * lay.cp > 1)
        return (t + (host.pp_chunk_s if lay.pp > 1 else 0.0)) * self.prof.eff("host")
