"""The collectives the planner prices, one table: each entry states what the physics model
(planner/profile/physics.py), the modelled profile entries (runtime/profiler/modelled.py), the profile's format
(planner/profile/records.py, validate.py) and the cost model read about that collective, so that none of them
branches on a collective's name.

A new collective is one `register_collective(Collective(...))` here plus, for the profiler to time it, one entry
of runtime/profiler/collectives.py's TIMINGS under the same name (tests/planner/test_collectives_table.py adds a
toy one through the table alone).

Group sizes: every function of an entry is called with n >= 2 ranks (k >= 2 nodes); the callers return 0 for a
group of one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from planner.errors import PlanError

NODE_EFFICIENCIES = ("ring", "all_to_all", "pair")
"""Which achieved fraction of the NVLink rate a collective reaches inside a node (planner/profile/physics.py
NodePhysics: ring_eff, alltoall_eff, p2p_eff)."""
NETWORK_EFFICIENCIES = ("ring", "all_to_all")
"""Which achieved fraction of the NIC rate a collective reaches across nodes (physics.py NET_EFF, NET_A2A_EFF)."""


@dataclass(frozen=True)
class Collective:
    """One collective and the terms its models read.

    Bus bandwidth follows nccl-tests' convention: time = latency + buffer bytes x bus_factor(n) / busbw, the
    buffer being the collective's full one (all-gather output, reduce-scatter input).
    """

    name: str
    """The profile's `op` and the cost model's name for it, e.g. 'all_reduce'."""
    bus_factor: Callable[[int], float]
    """n ranks -> bytes each rank moves over its link per byte of the buffer (all-reduce 2(n-1)/n)."""
    ring_steps: Callable[[int], int]
    """n ranks of one node -> steps of NCCL's ring (all-reduce 2(n-1), all-gather n-1); each costs a
    low-latency step and, where `pipeline_fill`, a share of the ring's pipeline fill."""
    latency_steps: Callable[[int], int]
    """n ranks of one node -> low-latency steps of its small-message floor (the ring's steps for a ring
    collective, 2(n-1) for all-to-all, 2 for a pair)."""
    network_steps: Callable[[int], int]
    """k nodes of one rank each -> latency steps across the network (all-reduce NCCL's tree 2 ceil(log2 k)
    above 3 nodes, a ring's k-1)."""
    network_hops: Callable[[int], int]
    """n ranks -> NIC hops of the nominal network model a profile without measured network figures carries
    (runtime/profiler/modelled.py network_links: ceil(log2 n), twice for all-reduce, 1 for a pair)."""
    node_efficiency: str = "ring"
    """One of NODE_EFFICIENCIES: which measured fraction of the NVLink rate it reaches."""
    network_efficiency: str = "ring"
    """One of NETWORK_EFFICIENCIES: which measured fraction of the NIC rate it reaches."""
    pipeline_fill: bool = False
    """Runs as NCCL's pipelined ring inside a node: mid-size messages pay the ring's fill (physics.py FILL_*)."""
    nvls: bool = False
    """NVLink SHARP can run it (all-reduce on H100/H200 above 4 GPUs, when the profile's runs allow NVLS)."""
    pairwise: bool = False
    """Two ranks whatever the group (send/recv): timed in the 2-rank group only, its larger groups copy the pair,
    and across nodes it runs over the NICs alone."""
    node_shares: bool = False
    """Each rank sends a distinct 1/n share of its buffer to every rank (all-to-all): across nodes only the share
    (n - g)/n leaving the node crosses the NICs, the (g - 1)/n staying inside runs over NVLink at the same time."""

    def __post_init__(self):
        if self.node_efficiency not in NODE_EFFICIENCIES:
            raise PlanError(f"collective '{self.name}': node_efficiency '{self.node_efficiency}' is not one of "
                            f"{', '.join(NODE_EFFICIENCIES)}")
        if self.network_efficiency not in NETWORK_EFFICIENCIES:
            raise PlanError(f"collective '{self.name}': network_efficiency '{self.network_efficiency}' is not one "
                            f"of {', '.join(NETWORK_EFFICIENCIES)}")


COLLECTIVES: dict[str, Collective] = {}
"""name -> Collective, in the order registered (the order profiles list their entries in)."""


def register_collective(collective: Collective) -> Collective:
    """Add `collective` to COLLECTIVES; a name already registered is refused."""
    if collective.name in COLLECTIVES:
        raise PlanError(f"collective '{collective.name}' is already registered")
    COLLECTIVES[collective.name] = collective
    return collective


def collective_named(name: str) -> Collective:
    """The registered collective `name`; an unknown name is a PlanError."""
    c = COLLECTIVES.get(name)
    if c is None:
        raise PlanError(f"unknown collective '{name}'")
    return c


def collective_names() -> tuple[str, ...]:
    """The registered collectives' names, in registration order."""
    return tuple(COLLECTIVES)


def _ring(n: int) -> int:
    return n - 1


def _twice_ring(n: int) -> int:
    return 2 * (n - 1)


def _one(n: int) -> int:
    return 1


def _log_hops(n: int) -> int:
    return math.ceil(math.log2(n))


def _twice_log_hops(n: int) -> int:
    return math.ceil(math.log2(n)) * 2


def _all_reduce_network_steps(k: int) -> int:
    return min(2 * (k - 1), 2 * math.ceil(math.log2(k)))   # NCCL's tuner: ring at 2-3 nodes, tree above


def _ring_share(n: int) -> float:
    return (n - 1) / n


register_collective(Collective(
    "all_reduce", bus_factor=lambda n: 2.0 * (n - 1) / n, ring_steps=_twice_ring, latency_steps=_twice_ring,
    network_steps=_all_reduce_network_steps, network_hops=_twice_log_hops, pipeline_fill=True, nvls=True))
register_collective(Collective(
    "all_gather", bus_factor=_ring_share, ring_steps=_ring, latency_steps=_ring, network_steps=_ring,
    network_hops=_log_hops, pipeline_fill=True))
register_collective(Collective(
    "reduce_scatter", bus_factor=_ring_share, ring_steps=_ring, latency_steps=_ring, network_steps=_ring,
    network_hops=_log_hops, pipeline_fill=True))
register_collective(Collective(
    "all_to_all", bus_factor=_ring_share, ring_steps=_one, latency_steps=_twice_ring, network_steps=_one,
    network_hops=_log_hops, node_efficiency="all_to_all", network_efficiency="all_to_all", node_shares=True))
register_collective(Collective(
    "send_recv", bus_factor=lambda n: 1.0, ring_steps=_one, latency_steps=lambda n: 2, network_steps=_one,
    network_hops=_one, node_efficiency="pair", pairwise=True))
