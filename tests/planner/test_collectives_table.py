"""The table of collectives (planner/collectives.py): a collective registered there alone is priced by the physics
model, written into modelled profiles, accepted by a profile's checks and priced by the cost model; the built-in
entries carry nccl-tests' bus factors and NCCL's step counts."""
from __future__ import annotations

import math

import pytest

from planner.cluster import ClusterSpec
from planner.collectives import COLLECTIVES, Collective, collective_named, register_collective
from planner.cost import CostModel
from planner.errors import PlanError
from planner.model import CATALOGUE
from planner.plan import Layout, TrainingShape
from planner.profile import COLLECTIVE_OPS, Profile, bus_factor, physics
from runtime.profiler import modelled


def _ring(n: int) -> int:
    return n - 1


BROADCAST = Collective("broadcast", bus_factor=lambda n: 1.0, ring_steps=_ring, latency_steps=_ring,
                       network_steps=_ring, network_hops=lambda n: math.ceil(math.log2(n)), pipeline_fill=True)
"""nccl-tests' broadcast: busbw = algbw (factor 1), a pipelined ring of n - 1 steps."""


@pytest.fixture
def broadcast():
    register_collective(BROADCAST)
    try:
        yield BROADCAST
    finally:
        del COLLECTIVES["broadcast"]


def test_a_registered_collective_is_priced_by_the_physics_model(broadcast):
    node = physics.NODES["h100-sxm"]
    fit = physics.node_fit("broadcast", 8, "h100-sxm")
    assert fit.latency_s == node.ll_step_s * 7
    assert fit.bus_bandwidth_bytes_per_s == node.ring_eff * node.nvlink_gb_per_s * 1e9
    assert fit.fill_s == physics.FILL_STEP_S * 7 and fit.fill_ratio == physics.FILL_RATIO
    size = 1 << 30
    assert fit.time_s(size) == pytest.approx(
        fit.latency_s + size / fit.bus_bandwidth_bytes_per_s + physics.FILL_STEP_S * 7)
    net = physics.network_fit("broadcast", 4)
    assert net.latency_s == physics.NET_STEP_S * 3
    assert net.bus_bandwidth_bytes_per_s == physics.NET_EFF * physics.NOMINAL_NIC_GB_PER_S * 1e9
    # 4 nodes of 8: the NICs (8 x NET_EFF x 50 GB/s) are faster than NVLink's ring, which bounds it
    spanning = physics.spanning_s("broadcast", size, 8, 4, fit, net)
    assert spanning == pytest.approx(fit.overhead_s(size) + net.latency_s + size / fit.bus_bandwidth_bytes_per_s)
    assert physics.predict_busbw_gb_per_s("broadcast", size, 32, 8, "h100-sxm", 50.0) > 0


def test_a_registered_collective_is_in_modelled_profiles_and_priced(broadcast, profile):
    remodelled = physics.remodel_collectives(profile)
    ours = {(c.link, c.group_size) for c in remodelled.collectives if c.op == "broadcast"}
    assert {("nvlink", 2), ("nvlink", 4), ("nvlink", 8)} <= ours
    assert {("network", 2 ** i) for i in range(1, 13)} <= ours
    assert {c.op for c in modelled.network_links()} == set(COLLECTIVES)
    assert {c.op for c in modelled.single_gpu_nvlink(450.0)} == set(COLLECTIVES)
    # the profile's checks accept it: a save/load round trip validates every entry
    again = Profile.from_dict(remodelled.to_dict())
    assert again.collective_s("broadcast", 1 << 24, 8, "nvlink") == pytest.approx(
        physics.node_fit("broadcast", 8, profile.gpu).time_s(1 << 24))
    # the cost model prices it inside a node and across nodes
    cm = CostModel(CATALOGUE["gpt-1.3b"], TrainingShape(2048, 64), Layout(dp=16),
                   ClusterSpec(num_gpus=16, gpus_per_node=8), again)
    inside = cm.group_collective_s("broadcast", 1 << 28, 8, 1)
    across = cm.group_collective_s("broadcast", 1 << 28, 16, 1)
    assert 0 < inside < across


def test_an_unregistered_collective_is_refused_in_a_profile(profile):
    d = profile.to_dict()
    d["collectives"][0]["op"] = "broadcast"
    with pytest.raises(PlanError, match="op is 'broadcast', not one of all_reduce"):
        Profile.from_dict(d)
    with pytest.raises(PlanError, match="unknown collective 'broadcast'"):
        bus_factor("broadcast", 4)


def test_a_name_registers_once():
    with pytest.raises(PlanError, match="already registered"):
        register_collective(collective_named("all_reduce"))


def test_the_built_in_collectives_carry_their_hand_computed_terms():
    assert COLLECTIVE_OPS == ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
    for n in (2, 3, 4, 8, 64):
        assert bus_factor("all_reduce", n) == 2.0 * (n - 1) / n
        for op in ("all_gather", "reduce_scatter", "all_to_all"):
            assert bus_factor(op, n) == (n - 1) / n
        assert bus_factor("send_recv", n) == 1.0
        assert physics.ring_steps("all_reduce", n) == 2 * (n - 1)
        assert physics.ring_steps("all_gather", n) == physics.ring_steps("reduce_scatter", n) == n - 1
        assert physics.ring_steps("all_to_all", n) == physics.ring_steps("send_recv", n) == 1
        assert collective_named("all_to_all").latency_steps(n) == 2 * (n - 1)
        assert collective_named("send_recv").latency_steps(n) == 2
    for op in COLLECTIVE_OPS:
        assert bus_factor(op, 1) == 0.0 and physics.ring_steps(op, 1) == 0 and physics.network_steps(op, 1) == 0
    # across k nodes: all-reduce's ring at 2-3 nodes, NCCL's tree (2 ceil(log2 k)) above
    assert [physics.network_steps("all_reduce", k) for k in (2, 3, 4, 8, 1024)] == [2, 4, 4, 6, 20]
    assert [physics.network_steps("all_gather", k) for k in (2, 4, 8)] == [1, 3, 7]
    assert physics.network_steps("all_to_all", 8) == physics.network_steps("send_recv", 8) == 1
    assert [collective_named("all_reduce").network_hops(n) for n in (2, 4, 5, 8)] == [2, 4, 6, 6]
    assert [collective_named("all_gather").network_hops(n) for n in (2, 4, 5, 8)] == [1, 2, 3, 3]
    assert collective_named("send_recv").network_hops(4096) == 1
    assert [name for name, c in COLLECTIVES.items() if c.pairwise] == ["send_recv"]
    assert [name for name, c in COLLECTIVES.items() if c.nvls] == ["all_reduce"]
    assert [name for name, c in COLLECTIVES.items() if c.node_shares] == ["all_to_all"]
    assert physics.network_fit("all_to_all", 4).bus_bandwidth_bytes_per_s == \
        physics.NET_A2A_EFF * physics.NOMINAL_NIC_GB_PER_S * 1e9


def test_the_profiler_times_what_the_planner_prices():
    """Every collective the profiler times has a planner entry of the same name, in the planner's order."""
    from runtime.profiler import collectives as timed

    assert timed.OPS == COLLECTIVE_OPS
    assert set(timed.TIMINGS) <= set(COLLECTIVES)
    assert [timed.times_at("send_recv", g) for g in (2, 4)] == [True, False]
    assert timed.steps(8, "cpu", True) == len(timed.message_sizes("cpu", True)) * (5 + 4 + 4)
