"""Communication pricing: a collective over a group of ranks placed on the cluster (NVLink inside a node, the
network across nodes), and the pipeline's hop between stages."""
from __future__ import annotations

from dataclasses import replace

from planner.cluster import place_group
from planner.profile.physics import NOMINAL_NIC_GB_PER_S, network_fit, spanning_s
from planner.cost.terms import BF16, cached_property


class CommTerms:
    """CostModel's collective and point-to-point prices."""

    # -- communication pricing ----------------------------------------------------------------------
    def group_collective_s(self, op: str, size_bytes: float, size: int, stride: int) -> float:
        """A collective over `size` ranks spaced `stride` apart, priced by where the group sits."""
        if size <= 1 or size_bytes <= 0:
            return 0.0
        key = ("coll", op, size_bytes, size, stride)
        v = self._shared.get(key)
        if v is None:
            v = self._shared[key] = self._group_collective_s(op, size_bytes, size, stride)
        return v

    def _group_collective_s(self, op: str, size_bytes: float, size: int, stride: int) -> float:
        place = place_group(self.cluster, size, stride)
        if place.link == "nvlink":
            # inside a node: the profile's entry at this group size; measured points at 2 GPUs (log-log between
            # them; the fitted line outside them), the physics model's at 4 and 8 (planner/profile/physics.py)
            return self.prof.collective_s(op, size_bytes, size, "nvlink")
        # across nodes: hierarchical, the node's part from the NVLink entry, the network part from the profile's
        # network entry at the cluster's NIC rate (planner/profile/physics.py spanning_s)
        per_node = max(place.ranks_per_node, 1)
        nodes = max(size // per_node, 2)
        intra = self.prof.collective(op, per_node, "nvlink") if per_node > 1 else None
        return spanning_s(op, size_bytes, per_node, nodes, intra, self._network_fit(op, nodes))

    def _network_fit(self, op: str, nodes: int):
        """The profile's network entry for `op` over `nodes` ranks one per node, its bus bandwidth carried from the
        NIC rate it was written at (extras.network_model) to the cluster's inter_node_gb_per_s."""
        key = ("net", op, nodes)
        fit = self._shared.get(key)
        if fit is None:
            if any(c.op == op and c.link == "network" for c in self.prof.collectives):
                base = self.prof.collective(op, nodes, "network")
            else:  # a profile without network entries: the physics model's
                base = network_fit(op, nodes)
            nominal = float((self.prof.extras.get("network_model") or {}).get("nic_gb_per_s", NOMINAL_NIC_GB_PER_S))
            fit = self._shared[key] = replace(
                base, bus_bandwidth_bytes_per_s=base.bus_bandwidth_bytes_per_s * self.cluster.inter_node_gb_per_s
                / nominal)
        return fit

    @cached_property
    def strides(self) -> dict:
        lay = self.lay
        # expert groups: ours, consecutive ranks of dp x cp, spaced by tp; with expert tensor parallel 1 (Megatron's
        # ETP 1, RuntimeTarget.expert_states_over_tp) consecutive ranks of tp x dp x cp: its expert rank generator
        # orders tp-cp-ep-dp-pp with cp 1 and the expert TP of 1 (megatron/core/parallel_state.py,
        # initialize_model_parallel), so an EP group of 64 at TP 2 fills 8 nodes rather than spanning 16
        return {"tp": 1, "cp": lay.tp, "dp": lay.tp * lay.cp, "pp": lay.tp * lay.cp * lay.dp,
                "ep": 1 if self.target.expert_states_over_tp else lay.tp}


    @cached_property
    def p2p_s(self) -> float:
        """One hop of the pipeline: from the end of a virtual stage's forward (backward) on one rank to the
        start of the next (previous) stage's on another, for one micro-batch: the activation's transfer
        (profile) times the calibrated 'pp' factor, which also carries the synchronisation around the
        runtime's per-tick batched sends. The schedule play (planner/schedule.py) decides which hops wait.
        With overlap_pp off the sends are not posted ahead, so the sender waits for its transfer too."""
        if self.lay.pp == 1:
            return 0.0
        nbytes = BF16 * self.tokens * self.m.hidden / self.lay.tp
        hop = self.group_collective_s("send_recv", nbytes, 2, self.strides["pp"]) * self.prof.eff("pp")
        return hop if self.lay.overlap_pp else 2 * hop
