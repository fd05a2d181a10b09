"""Profile.graph_kernel_s: the fixed GPU time per kernel of a step replayed as a CUDA graph."""
from __future__ import annotations

import dataclasses

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.model import tiny_model
from planner.plan import Layout, StagePlan, TrainingShape
from planner.profile import Profile, load_profile

PROF = load_profile(None, "h200-sxm")
MODEL = tiny_model("gpt", num_layers=4)
SHAPE = TrainingShape(seq_len=32, global_batch=8)
CLUSTER = ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1)


def step_s(prof: Profile, graph: bool) -> float:
    lay = Layout(micro_batch=2, cuda_graph=graph)
    return CostModel(MODEL, SHAPE, lay, CLUSTER, prof).predict([StagePlan(layers=4)]).step_s


def test_gemm_fixed_term_is_the_profiles():
    base = dataclasses.replace(PROF, graph_kernel_s=None)
    g = base.for_graph_replay()
    assert g is base  # no fitted value: graphed steps keep the eager terms
    fitted = dataclasses.replace(PROF, graph_kernel_s=1e-6).for_graph_replay()
    # the same table time, only the fixed term differs: 5 us eager, 1 us replayed
    assert base.gemm_s(256, 256, 256) - fitted.gemm_s(256, 256, 256) == pytest.approx(4e-6, abs=1e-12)
    assert fitted.memory_bound_s(1 << 20) - base.memory_bound_s(1 << 20) == pytest.approx(1e-6 - base.kernel_launch_s)


def test_only_graphed_steps_use_it():
    none = dataclasses.replace(PROF, graph_kernel_s=None)
    small = dataclasses.replace(PROF, graph_kernel_s=0.5e-6)
    assert step_s(small, graph=False) == step_s(none, graph=False)  # eager: the host's launch, unchanged
    assert step_s(small, graph=True) < step_s(none, graph=True)      # tiny kernels: the fixed term dominates


def test_round_trips_through_the_profile_file():
    d = dataclasses.replace(PROF, graph_kernel_s=3.25e-6).to_dict()
    assert Profile.from_dict(d).graph_kernel_s == 3.25e-6
    d.pop("graph_kernel_s")
    assert Profile.from_dict(d).graph_kernel_s is None
