"""The per-node deduplicated MoE dispatch (RuntimeTarget.ep_dispatch_per_node, planner/cost/layer.py
_ep_all_to_all_s): a token crosses the network once per remote destination node, capped by the routing's node
limit, and the node's NVLink fans its copies out; off, the plain all-to-all prices every routed copy."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.cost.moe_layer import dispatch_remote_nodes
from planner.cost.targets import load_target
from planner.cost.terms import BF16
from planner.model import resolve_model
from planner.plan import Layout, TrainingShape


def test_remote_nodes_by_hand():
    # top 8 over 8 nodes: (7/8)^8 = 0.34360891580581665, distinct 8 x 0.65639... = 5.2511286735534668,
    # remote 7/8 of it = 4.594737589359283
    assert dispatch_remote_nodes(8, 8) == pytest.approx(4.594737589359283, rel=1e-12)
    assert dispatch_remote_nodes(8, 8, groups=8, group_limit=4) == pytest.approx(3.5, rel=1e-12)  # 4 x 7/8
    assert dispatch_remote_nodes(8, 8, groups=8, group_limit=6) == pytest.approx(4.594737589359283, rel=1e-12)
    # 16 nodes, 8 groups of 2 nodes each: at most 4 x 2 = 8 nodes, above 16 x (1 - (15/16)^8) = 6.4525, so the
    # uniform figure stands: 6.4525 x 15/16 = 6.0492 remote
    assert dispatch_remote_nodes(8, 16, groups=8, group_limit=4) == pytest.approx(
        16 * (1 - (15 / 16) ** 8) * 15 / 16, rel=1e-12)
    assert dispatch_remote_nodes(8, 16, groups=8, group_limit=2) == pytest.approx(4 * 15 / 16, rel=1e-12)
    assert dispatch_remote_nodes(1, 2) == pytest.approx(0.5)  # one expert: its node is remote half the time
    assert dispatch_remote_nodes(8, 1) == 0.0


def _model(profile, per_node: bool):
    m = resolve_model("mixtral-8x7b")
    target = replace(load_target("megatron"), ep_dispatch_per_node=per_node)
    lay = Layout(ep=8, micro_batch=1, sharding="optimizer")
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=4)
    return m, CostModel(m, TrainingShape(4096, 8), lay, cluster, profile, target=target)


def test_per_node_dispatch_by_hand(profile):
    m, cm = _model(profile, True)
    tokens = 4096.0
    # EP 8 = 2 nodes x 4 ranks; top 2 of 8 experts over 2 nodes: distinct 2 x (1 - 1/4) = 1.5, remote 0.75
    net = cm._network_fit("all_to_all", 2)
    intra = cm.prof.collective("all_to_all", 4, "nvlink")
    t_net = BF16 * tokens * m.hidden * 0.75 / net.bus_bandwidth_bytes_per_s
    t_intra = BF16 * tokens * 2 * m.hidden * 3 / 4 / intra.bus_bandwidth_bytes_per_s
    want = intra.latency_s + net.latency_s + max(t_net, t_intra)
    assert cm._ep_all_to_all_s(tokens, 1) == pytest.approx(want, rel=1e-12)
    assert cm._ep_all_to_all_s(tokens, 2) < want  # half the tokens per chunk
    # off: the plain all-to-all of every routed copy, as the group's placement prices it
    _, plain = _model(profile, False)
    assert plain._ep_all_to_all_s(tokens, 1) == pytest.approx(
        plain.group_collective_s("all_to_all", BF16 * tokens * 2 * m.hidden, 8, plain.strides["ep"]), rel=1e-12)
    # the plain all-to-all sends half the copies (4 of 8 ranks off-node) over the NICs: 1 x hidden per token
    # against the per-node 0.75 x hidden, so the per-node dispatch is cheaper
    assert cm._ep_all_to_all_s(tokens, 1) < plain._ep_all_to_all_s(tokens, 1)


def test_megatron_expert_groups_are_consecutive_ranks(profile):
    # TP 2, EP 8 on 16 GPUs of 8 a node: ours spaces the EP group by TP (ranks 0, 2, ..., 14: two nodes of 4);
    # Megatron with ETP 1 takes consecutive ranks (0-7: one node), so its all-to-all stays on NVLink
    m = resolve_model("mixtral-8x7b")
    lay = Layout(tp=2, ep=8, micro_batch=1, sharding="optimizer")
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=16, gpus_per_node=8)
    ours = CostModel(m, TrainingShape(4096, 16), lay, cluster, profile)
    meg = CostModel(m, TrainingShape(4096, 16), lay, cluster, profile, target=load_target("megatron"))
    assert (ours.strides["ep"], meg.strides["ep"]) == (2, 1)
    nbytes = BF16 * 2048 * 2 * m.hidden
    assert meg._ep_all_to_all_s(2048, 1) == pytest.approx(profile.collective_s("all_to_all", nbytes, 8, "nvlink"),
                                                          rel=1e-12)
    assert ours._ep_all_to_all_s(2048, 1) > meg._ep_all_to_all_s(2048, 1)  # half its copies over the NICs
