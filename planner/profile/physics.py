"""Collectives beyond the measured two GPUs, from their physics: NCCL's algorithms over the link rates, with the
achieved fraction of each link and the latency terms read off published nccl-tests figures
(benchmarks/published/collectives.csv, cited below by row number: the CSV's data rows counted from 1).

Bus bandwidth follows nccl-tests' convention (planner.profile.bus_factor): time = latency + bytes x factor / busbw.

Inside one NVSwitch node (n GPUs, each with B GB/s of NVLink per direction):

- ring all-reduce, reduce-scatter, all-gather: busbw = eff_ring x B. Latency: one low-latency (LL) step per ring
  step (2(n-1) for all-reduce, n-1 otherwise), `ll_step_s` each. Mid-size messages do not fill the ring's pipeline:
  NCCL splits a message into chunks that travel the ring one step behind each other, so up to a message of a
  few chunks per step the ring runs at 1/(1 + fill_ratio) of its plateau; above that the fill costs a fixed
  `fill_step_s` per ring step. One formula covers both: t = latency + X + min(fill_ratio X, steps x fill_step_s),
  X = bytes x factor / busbw (CollectiveFit.time_s). Fitted on the A100 ring rows 3-5 and 9-11 (1-64 MiB), the
  only published mid-size ring rows; H100/H200 ring rows are all at >= 8 GiB, so their fill terms are A100's.
- NVLink SHARP (NVLS, all-reduce on H100/H200 with more than 4 GPUs; NCCL_NVLS_ENABLE=1): the switch reduces,
  so each GPU sends and receives the buffer once: t = latency + S / (eff_nvls x B) (+ fill), whatever n.
  The runtime's profiles force NVLS off (provenance.environment_forced), so their entries are ring; the NVLS
  model is here for targets that run with it (Megatron-Core's default) and for the check against rows 24-36.
- all-to-all: one step of n-1 concurrent sends, eff_a2a x B. send/recv: a pair at eff_p2p x B.

Across nodes (k nodes, g ranks of the group on each, one NIC per GPU of N GB/s per direction):

- A group of one rank per node (g = 1) runs over its ranks' own NICs ('network' entries of the profile, at
  group size k): busbw = eff_net x N; all-reduce as NCCL's tree, 2 ceil(log2 k) steps of `net_step_s`
  (which, fitted on rows 58-73, carries the tree's pipeline fill at mid sizes too); reduce-scatter, all-gather as a
  ring, k - 1 steps; all-to-all NIC-bound at eff_net_a2a x N on the share that leaves the node.
- A group with g > 1 ranks per node (hierarchical, as NCCL's rings and trees place their channels): the node's g
  ranks drive g NICs in parallel, so the inter-node part moves at g x eff_net x N in busbw terms, and the
  intra-node part at the NVLink busbw; the slower bounds the collective (the two pipeline against each other),
  and the latencies add: t = lat_intra(g) + lat_net(k) + S factor(n) / min(busbw_intra, g busbw_net).
  All-to-all: the share (n - g)/n of the buffer leaves the node over the NICs, (g - 1)/n stays on NVLink.

What differs between collectives (bus factor, ring / latency / network steps, which efficiency, NVLS, a pair,
the all-to-all share split) is read from planner.collectives' table; this module holds the figures.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from planner.collectives import COLLECTIVES, Collective, collective_named
from planner.errors import PlanError
from planner.profile.records import CollectiveFit, bus_factor

if TYPE_CHECKING:  # the profile module imports this one
    from planner.profile.core import Profile

CSV = "benchmarks/published/collectives.csv"


@dataclass(frozen=True)
class NodePhysics:
    """One GPU kind's NVSwitch node: link rate and the published achieved fractions and latencies."""

    gpu: str
    nvlink_gb_per_s: float
    """Per GPU, per direction (datasheet)."""
    ring_eff: float
    """Ring all-reduce / all-gather / reduce-scatter busbw over nvlink_gb_per_s at large messages."""
    alltoall_eff: float
    p2p_eff: float
    ll_step_s: float
    """Latency of one ring step at small messages: the 8-GPU all-reduce floor over its 14 steps."""
    nvls_eff: float = 0.0
    """Algorithm bandwidth (S / t) of an NVLS all-reduce over nvlink_gb_per_s; 0: no NVLink SHARP."""
    nvls_latency_s: float = 0.0
    rows: tuple = ()
    """Rows of collectives.csv the figures come from."""
    note: str = ""


FILL_RATIO = 0.65
"""Ring pipeline: below its fill a mid-size message runs at 1/(1 + 0.65) of the plateau (rows 3-5, 9-11)."""
FILL_STEP_S = 6.5e-6
"""Ring pipeline fill at large messages, per ring step (rows 3-5, 9-11: 91 us for the 14 steps of 8 GPUs)."""
NVLS_FILL_RATIO = 1.85
NVLS_FILL_S = 26e-6
"""NVLS all-reduce's mid-size fall-off (rows 25-29, 32-34, 47-50, fitted jointly for H100 and H200)."""

NODES: dict[str, NodePhysics] = {
    # rows 1, 2, 8, 13: 229-235 GB/s busbw of 300; row 20: alltoall 210; row 54: p2p 274; row 7: 43.8 us at 32 KiB
    "a100-80gb": NodePhysics("a100-80gb", 300.0, 0.78, 0.70, 0.91, 43.8e-6 / 14,
                             rows=(1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 13, 20, 54),
                             note="A100 has no NVLink SHARP: ring (rows 1-13)"),
    # row 14: ring 370 of 450; row 21: alltoall 320; row 55: p2p 376; row 30: 1 KiB all-reduce at 25.6 us;
    # row 24: NVLS busbw 478.9 at 8 GiB = algbw 273.6 = 0.608 x 450
    "h100-sxm": NodePhysics("h100-sxm", 450.0, 0.81, 0.711, 0.836, 25.6e-6 / 14, nvls_eff=0.608,
                            nvls_latency_s=25.6e-6, rows=(14, 15, 21, 24, 25, 26, 27, 28, 29, 30, 55)),
    # rows 37-40, 45: ring 361-367 of 450; row 53: p2p 396.4; row 35: 1 KiB all-reduce at 29.9 us;
    # row 46: NVLS algbw 275.6 = 0.612 x 450; alltoall: H100's row 21 (same NVLink 4, no H200 row)
    "h200-sxm": NodePhysics("h200-sxm", 450.0, 0.81, 0.711, 0.88, 29.9e-6 / 14, nvls_eff=0.612,
                            nvls_latency_s=29.9e-6,
                            rows=(21, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50,
                                  53)),
}
# H800: the H100 die with NVLink cut to 8 links, 400 GB/s bidirectional = 200 GB/s per direction (DeepSeek-V3
# report's cluster); the fractions are H100's (same NVLink 4 and NVSwitch), not measured.
NODES["h800"] = NodePhysics("h800", 200.0, 0.81, 0.711, 0.836, 25.6e-6 / 14, nvls_eff=0.608,
                            nvls_latency_s=25.6e-6, rows=(14, 21, 24, 30, 55),
                            note="H100's fractions over H800's 200 GB/s per direction (no H800 nccl-tests row)")
# H100 SXM 96 GB HBM2e: the H100 SXM die with the same NVLink 4 and NVSwitch, only the HBM differs: H100's figures.
NODES["h100-96gb"] = replace(NODES["h100-sxm"], gpu="h100-96gb",
                             note="H100 SXM's figures: same NVLink 4 (NV18) and NVSwitch; only the HBM differs")


NET_EFF = 0.94
"""All-reduce / ring busbw over the per-GPU NIC rate: row 16 (8x HDR 200G A100 nodes, 192 of 8 x 25 GB/s = 0.96),
rows 56 and 17 (8x NDR 400G H100 nodes, 375 and 370, NVLink-bound at >= 0.92 of 8 x 50 GB/s)."""
NET_A2A_EFF = 0.74
"""All-to-all across nodes: rows 22-23 (24 and 48 GB/s busbw at 32 GPUs = (31/24) x 0.74 x the NIC rate)."""
NET_STEP_S = 45e-6
"""Per tree (all-reduce) or ring step across nodes, with its pipeline fill at mid sizes: rows 58-65, 67-73
(H100, 32-8192 GPUs, 1 MiB - 1 GiB; 40-50 us per step of 2 log2(nodes))."""
NET_ROWS = (16, 17, 22, 23, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74)
NOMINAL_NIC_GB_PER_S = 50.0
"""The NIC rate the profiles' 'network' entries are written at (one 400 Gb/s NDR NIC per GPU); the cost model
rescales them to the cluster's inter_node_gb_per_s."""


def node_efficiency(p: NodePhysics, collective: Collective) -> float:
    """The achieved fraction of `p`'s NVLink rate that `collective` reaches (its node_efficiency)."""
    return {"ring": p.ring_eff, "all_to_all": p.alltoall_eff, "pair": p.p2p_eff}[collective.node_efficiency]


NETWORK_EFFICIENCY = {"ring": NET_EFF, "all_to_all": NET_A2A_EFF}
"""planner.collectives.NETWORK_EFFICIENCIES -> the achieved fraction of the NIC rate."""


def ring_steps(op: str, n: int) -> int:
    """Steps of NCCL's ring for `op` over n ranks (planner.collectives: a pair for send/recv, one round of sends
    for all-to-all)."""
    if n <= 1:
        return 0
    return collective_named(op).ring_steps(n)


def node_fit(op: str, n: int, gpu: str, nvls: bool = False) -> CollectiveFit:
    """`op` over n GPUs of one NVSwitch node of `gpu` (modelled). nvls: all-reduce with NVLink SHARP where the
    GPU has it and n > 4 (NCCL picks ring at 4 or fewer)."""
    p = NODES[gpu]
    c = collective_named(op)
    b = p.nvlink_gb_per_s * 1e9
    if c.nvls and nvls and p.nvls_eff > 0 and n > 4:
        # S moved once at nvls_eff x B, in busbw terms: busbw = factor x algbw
        return CollectiveFit(op=op, link="nvlink", group_size=n, latency_s=p.nvls_latency_s,
                             bus_bandwidth_bytes_per_s=bus_factor(op, n) * p.nvls_eff * b, measured=False,
                             fill_ratio=NVLS_FILL_RATIO, fill_s=NVLS_FILL_S)
    busbw = node_efficiency(p, c) * b
    if not c.pipeline_fill:
        return CollectiveFit(op=op, link="nvlink", group_size=n, latency_s=p.ll_step_s * c.latency_steps(n),
                             bus_bandwidth_bytes_per_s=busbw, measured=False)
    steps = ring_steps(op, n)
    return CollectiveFit(op=op, link="nvlink", group_size=n, latency_s=p.ll_step_s * c.latency_steps(n),
                         bus_bandwidth_bytes_per_s=busbw, measured=False,
                         fill_ratio=FILL_RATIO, fill_s=FILL_STEP_S * steps)


def network_steps(op: str, k: int) -> int:
    """Latency steps of `op` across k nodes of one rank each (planner.collectives: all-reduce as NCCL's tree)."""
    if k <= 1:
        return 0
    return collective_named(op).network_steps(k)


def network_fit(op: str, k: int, nic_gb_per_s: float = NOMINAL_NIC_GB_PER_S) -> CollectiveFit:
    """`op` over k ranks on k nodes, each over its own NIC (modelled)."""
    eff = NETWORK_EFFICIENCY[collective_named(op).network_efficiency]
    return CollectiveFit(op=op, link="network", group_size=k, latency_s=NET_STEP_S * network_steps(op, k),
                         bus_bandwidth_bytes_per_s=eff * nic_gb_per_s * 1e9, measured=False)


def spanning_s(op: str, size_bytes: float, per_node: int, nodes: int, intra: CollectiveFit | None,
               net: CollectiveFit) -> float:
    """A collective over `nodes` x `per_node` ranks (hierarchical; module docstring). intra: the node's fit at
    per_node ranks (None when per_node is 1); net: the network fit at `nodes` ranks, at the cluster's NIC rate."""
    n = per_node * nodes
    if size_bytes <= 0 or n <= 1:
        return 0.0
    if per_node <= 1 or intra is None:
        return net.time_s(size_bytes)
    c = collective_named(op)
    if c.pairwise:
        return net.time_s(size_bytes)
    if c.node_shares:
        t_net = (n - per_node) / n * size_bytes / net.bus_bandwidth_bytes_per_s
        t_intra = (per_node - 1) / n * size_bytes / intra.bus_bandwidth_bytes_per_s
        return intra.latency_s + net.latency_s + max(t_net, t_intra)
    busbw = min(intra.bus_bandwidth_bytes_per_s, per_node * net.bus_bandwidth_bytes_per_s)
    x = size_bytes * bus_factor(op, n) / busbw
    return intra.overhead_s(size_bytes) + net.latency_s + x


def modelled_entries(gpu: str, kept: list[CollectiveFit], max_group: int = 8,
                     nvls: bool = False) -> list[CollectiveFit]:
    """The modelled NVLink entries (powers of two up to max_group, where `kept` has none) and the network entries
    (2 - 4096 nodes, at NOMINAL_NIC_GB_PER_S) of a `gpu` profile. `kept`: the entries with points (measured, or
    carried from a measured profile). send/recv over a larger group is still a pair: it copies the kept pair."""
    have = {(c.op, c.group_size) for c in kept if c.link == "nvlink"}
    out = []
    for op, coll in COLLECTIVES.items():
        n = 2
        while n <= max_group:
            if (op, n) not in have:
                pair = [c for c in kept if c.link == "nvlink" and c.op == op and c.group_size == 2]
                if coll.pairwise and pair:
                    c = pair[0]
                    out.append(CollectiveFit(op=op, link="nvlink", group_size=n, latency_s=c.latency_s,
                                             bus_bandwidth_bytes_per_s=c.bus_bandwidth_bytes_per_s, measured=False))
                else:
                    out.append(node_fit(op, n, gpu, nvls))
            n *= 2
    for op in COLLECTIVES:
        out += [network_fit(op, 2 ** i) for i in range(1, 13)]
    return out


def provenance(gpu: str, nvls: bool = False) -> list[dict]:
    """The profile's provenance parts for the entries modelled_entries writes."""
    p = NODES[gpu]
    return [
        {"part": "collectives/nvlink groups not measured", "status": "modelled",
         "model": ("ring (NVLS off, as the profile's runs force it)" if not nvls else "ring; all-reduce NVLS above 4")
                  + f": busbw = {p.ring_eff} x {p.nvlink_gb_per_s:g} GB/s (all-to-all {p.alltoall_eff}, "
                  f"send/recv {p.p2p_eff}); t = steps x {p.ll_step_s * 1e6:.2f} us + X + min({FILL_RATIO} X, "
                  f"steps x {FILL_STEP_S * 1e6:.1f} us), X = bytes x factor / busbw, steps = 2(n-1) all-reduce, "
                  "n-1 reduce-scatter / all-gather (planner/profile/physics.py); send/recv copies the measured pair",
         "source": f"{CSV} rows {', '.join(map(str, p.rows))}" + (f"; {p.note}" if p.note else ""),
         "checked_by": "tests/planner/profile/test_collectives_physics.py"},
        {"part": "collectives/network", "status": "modelled",
         "model": f"one rank per node over its own NIC ({NOMINAL_NIC_GB_PER_S:g} GB/s per GPU, rescaled to the "
                  f"cluster's): busbw = {NET_EFF} x NIC (all-to-all {NET_A2A_EFF}); latency {NET_STEP_S * 1e6:.0f} us "
                  "x steps (all-reduce tree 2 ceil(log2 k), ring k-1); groups with several ranks per node: "
                  "hierarchical, planner/profile/physics.py spanning_s",
         "source": f"{CSV} rows {', '.join(map(str, NET_ROWS))}",
         "checked_by": "tests/planner/profile/test_collectives_physics.py"},
    ]


def predict_busbw_gb_per_s(op: str, size_bytes: float, n: int, gpus_per_node: int, gpu: str, nic_gb_per_s: float,
                           nvls: bool = False) -> float:
    """nccl-tests' busbw (GB/s) the model predicts for `op` of size_bytes over n GPUs packed on nodes of
    gpus_per_node (what collectives.csv publishes)."""
    per_node = min(n, gpus_per_node)
    nodes = max(n // per_node, 1)
    intra = node_fit(op, per_node, gpu, nvls) if per_node > 1 else None
    if nodes == 1:
        t = intra.time_s(size_bytes)
    else:
        t = spanning_s(op, size_bytes, per_node, nodes, intra, network_fit(op, nodes, nic_gb_per_s))
    return size_bytes * bus_factor(op, n) / t / 1e9


REPLACED_PARTS = ("collectives/nvlink groups", "collectives/network")


def remodel_collectives(prof: "Profile") -> "Profile":
    """The profile with every collective entry it has no points for (NVLink groups larger than those measured, the
    network) written from this model, labelled modelled in provenance; measured entries kept."""
    if prof.gpu not in NODES:
        raise PlanError(f"the physics model has no figures for GPU '{prof.gpu}'; known: {', '.join(NODES)}")
    forced = (prof.provenance.get("environment_forced") or prof.provenance.get("derived_from", {})
              .get("environment_forced") or {})
    nvls = forced.get("NCCL_NVLS_ENABLE", "1") != "0" and prof.gpu != "a100-80gb"
    kept = [c for c in prof.collectives if c.points]
    colls = kept + modelled_entries(prof.gpu, kept, nvls=nvls)
    prov = dict(prof.provenance)
    prov["parts"] = [p for p in prov.get("parts", []) if not str(p.get("part", "")).startswith(REPLACED_PARTS)] \
        + provenance(prof.gpu, nvls)
    extras = dict(prof.extras)
    extras["network_model"] = {"nic_gb_per_s": NOMINAL_NIC_GB_PER_S,
                               "latency_us_per_step": NET_STEP_S * 1e6, "model": "planner/profile/physics.py"}
    return replace(prof, collectives=colls, provenance=prov, extras=extras)
