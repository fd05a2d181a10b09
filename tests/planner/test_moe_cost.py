"""The MoE layer's memory-bound terms (planner/cost.py) by hand: the row movements of dispatch and combine, and
the stacked copy of the expert weights, which the runtime makes only where its flat buffers cannot hold each
projection's expert weights back to back (ZeRO-2, FSDP; runtime/parallel/data.py)."""
import pytest

from planner.cluster import ClusterSpec
from planner import memory as mem
from planner.cost import BF16, CostModel
from planner.model import resolve_model
from planner.plan import Layout, TrainingShape
from planner.profile import load_profile

PROF = load_profile(None, "h200-sxm")


def _layer(lay, spec):
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
    return CostModel(spec, TrainingShape(2048, 8), lay, cl, PROF).layer


def test_stacked_copy_only_under_zero2():
    spec = resolve_model("mixtral-8x7b")
    base = _layer(Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer"), spec)
    zero2 = _layer(Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer+grads"), spec)
    copy_s = PROF.memory_bound_s(2 * BF16 * mem.layer_expert_params_local(spec, 2)) * PROF.eff("expert")
    assert zero2.fwd_s - base.fwd_s == pytest.approx(copy_s, rel=1e-9)
    assert zero2.bwd_compute_s - base.bwd_compute_s == pytest.approx(copy_s, rel=1e-9)


@pytest.mark.parametrize("ep", [1, 2])
def test_row_passes_by_hand(ep):
    spec = resolve_model("mixtral-8x7b")
    lay = Layout(dp=2, ep=ep, micro_batch=1, sharding="optimizer")
    cm = CostModel(spec, TrainingShape(2048, 8), lay, ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2), PROF)
    tokens, h, k = 2048, spec.hidden, spec.top_k
    routed = tokens * k
    row = 2 * h   # bf16 bytes of one row
    fwd = row * (3 * routed + tokens) + (row * 4 * routed if ep > 1 else 0)   # gather; combine
    bwd = row * (4 * routed + tokens) + (row * 4 * routed if ep > 1 else 0)   # combine's backward; sum of copies
    f, b = cm._moe_row_passes_s(tokens, routed, h, ep > 1)
    assert f == pytest.approx(PROF.memory_bound_s(fwd), rel=1e-12)
    assert b == pytest.approx(PROF.memory_bound_s(bwd), rel=1e-12)
