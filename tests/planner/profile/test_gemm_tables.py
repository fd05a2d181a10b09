"""The profile's two GEMM tables: bf16-output GEMMs and weight-gradient GEMMs accumulated into fp32."""
from dataclasses import replace

import pytest

from planner.cost import CostModel
from planner.plan import Layout, TrainingShape
from planner.profile import Profile


def _scaled(points, factor):
    return [(m, n, k, t * factor) for m, n, k, t in points]


def test_wgrad_has_its_own_table_and_older_profiles_fall_back(profile):
    base = replace(profile, wgrad_points=[])
    m, n, k = profile.gemm_points[len(profile.gemm_points) // 2][:3]
    assert base.wgrad_s(m, n, k) == base.gemm_s(m, n, k)  # no wgrad table: the one table answers
    slow = replace(profile, wgrad_points=_scaled(base.gemm_points, 2.0))
    # the same shapes measured twice as slow as weight gradients: wgrad answers from them, gemm_s is unchanged
    assert slow.wgrad_s(m, n, k) - 5e-6 == pytest.approx(2 * (base.gemm_s(m, n, k) - 5e-6), rel=1e-9)
    assert slow.gemm_s(m, n, k) == base.gemm_s(m, n, k)
    back = Profile.from_dict(slow.to_dict())
    assert back.wgrad_points == slow.wgrad_points


def test_cost_model_prices_the_weight_gradient_from_the_wgrad_table(profile):
    from planner.cluster import ClusterSpec
    from planner.model import CATALOGUE

    gpt_small = CATALOGUE["gpt-1.3b"]
    base = replace(profile, wgrad_points=[])
    slow = replace(profile, wgrad_points=_scaled(base.gemm_points, 3.0))
    lay, shape = Layout(micro_batch=1, sharding="none"), TrainingShape(seq_len=2048, global_batch=1)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1)
    fast_layer = CostModel(gpt_small, shape, lay, cluster, base).layer
    slow_layer = CostModel(gpt_small, shape, lay, cluster, slow).layer
    assert slow_layer.fwd_compute_s == pytest.approx(fast_layer.fwd_compute_s)  # forward GEMMs never read the wgrad table
    assert slow_layer.bwd_compute_s > fast_layer.bwd_compute_s * 1.3


def test_plans_say_when_their_gemms_are_interpolated(profile):
    """A plan whose layer GEMMs are all measured points of the profile says nothing; one between the grid's
    token lines (micro-batch 5: 10240 tokens) names how many are interpolated and how to measure them."""
    from planner.cluster import ClusterSpec
    from planner.model import CATALOGUE
    from planner.plan import TrainingShape
    from planner.search import Pins, search
    gpt = CATALOGUE["gpt-1.3b"]
    on_grid = search(gpt, TrainingShape(2048, 8), ClusterSpec(num_gpus=1), profile, Pins(micro_batch=4), top_k=1).plans[0]
    between = search(gpt, TrainingShape(2048, 10), ClusterSpec(num_gpus=1), profile, Pins(micro_batch=5), top_k=1).plans[0]
    note = [m for m in between.provenance["modelled"] if m.startswith("GEMMs:")]
    assert note and "12 of this layout's 12" in note[0] and "plan profile --model gpt-1.3b" in note[0]
    assert not [m for m in on_grid.provenance["modelled"] if m.startswith("GEMMs:")]
    h = gpt.hidden
    assert profile.gemm_measured("mm", 8192, 3 * h, h) and not profile.gemm_measured("mm", 10240, 3 * h, h)
