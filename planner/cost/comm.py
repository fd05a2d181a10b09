"""Communication pricing: a collective over a group of ranks placed on the cluster (NVLink inside a node, the
network across nodes), and the pipeline's hop between stages."""
from __future__ import annotations

from planner.cluster import place_group
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
        if place_group(self.cluster, size, stride).link == "nvlink":
            # inside a node: the profile's measured points (log-log between them; its fitted line outside
            # them). The line alone ran 10-27% under the points at 1-16 MiB, where NCCL changes protocol.
            return self.prof.collective_s(op, size_bytes, size, "nvlink")
        key = ("link", op, size, stride)
        link = self._shared.get(key)
        if link is None:
            link = self._shared[key] = self._link_model(op, size, stride)
        latency_s, bus_bw = link
        from planner.profile import bus_factor
        return latency_s + size_bytes * bus_factor(op, size) / bus_bw

    def _link_model(self, op: str, size: int, stride: int) -> tuple[float, float]:
        """(latency, bus bandwidth) of a collective over a group that spans nodes (inside a node the measured
        points price it: _group_collective_s)."""
        place = place_group(self.cluster, size, stride)
        fit = self.prof.collective(op, size, "nvlink")
        # across nodes (modelled): NCCL's ring is limited by the slowest link on it, the per-GPU NIC; the
        # latency is NVLink's for the intra-node hops plus the network's per inter-node step
        bw = min(fit.bus_bandwidth_bytes_per_s, place.bottleneck_gb_per_s * 1e9)
        steps = max(size // max(place.ranks_per_node, 1) - 1, 1)
        return fit.latency_s + steps * self.cluster.inter_node_latency_us * 1e-6, bw

    @cached_property
    def strides(self) -> dict:
        lay = self.lay
        return {"tp": 1, "cp": lay.tp, "dp": lay.tp * lay.cp, "pp": lay.tp * lay.cp * lay.dp,
                "ep": lay.tp}  # expert groups: consecutive ranks of dp x cp, spaced by tp


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
