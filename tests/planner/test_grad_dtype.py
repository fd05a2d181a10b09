"""Layout.grad_dtype: bf16 main gradients halve the data-parallel reduction's bytes and the gradient memory in
the cost model, travel through the plan file and the Megatron export, and a wrong value is refused."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.errors import PlanError
from planner.export import megatron_args
from planner.model import CATALOGUE
from planner.plan import Layout, Plan, TrainingShape
from planner.search import Pins, search

GPT = CATALOGUE["gpt-1.3b"]
SHAPE = TrainingShape(2048, 64)


def _cost(profile, **lay):
    return CostModel(GPT, SHAPE, Layout(**lay), ClusterSpec(num_gpus=lay.get("dp", 1) * lay.get("tp", 1)), profile)


def test_bf16_gradients_reduce_half_the_bytes(profile):
    """The exposed ZeRO-1 reduction with overlap off is the whole reduce-scatter + all-gather: the
    reduce-scatter's bytes halve with bf16 gradients, the bf16 weights' all-gather does not change."""
    lay = dict(dp=8, micro_batch=4, sharding="optimizer", overlap_dp=False)
    fp32, bf16 = _cost(profile, **lay), _cost(profile, **lay, grad_dtype="bf16")
    params = 1.0e9
    rs32 = fp32.group_collective_s("reduce_scatter", 4 * params, 8, 1)
    rs16 = fp32.group_collective_s("reduce_scatter", 2 * params, 8, 1)
    ag = fp32.group_collective_s("all_gather", 2 * params, 8, 1)
    eff = profile.eff("dp")
    assert fp32.dp_comm_s(params, 0, 1.0, 1.0, 1) == pytest.approx((rs32 + ag) * eff)
    assert bf16.dp_comm_s(params, 0, 1.0, 1.0, 1) == pytest.approx((rs16 + ag) * eff)


def test_bf16_gradients_predict_less_memory_and_no_slower_steps(profile):
    cluster = ClusterSpec(num_gpus=8)
    plans = {g: search(GPT, SHAPE, cluster, profile, Pins(dp=8, tp=1, pp=1, micro_batch=2, sharding="optimizer",
                                                           recompute="none", grad_dtype=g), top_k=1).plans[0]
             for g in ("fp32", "bf16")}
    assert plans["bf16"].layout.grad_dtype == "bf16" and "bf16-grads" in plans["bf16"].layout.short()
    a, b = plans["fp32"].prediction, plans["bf16"].prediction
    # 2 B per parameter less of main gradient (the reduce-scatter outputs, 2 B less per shard element, count
    # only on the reduction path, which is not this plan's peak)
    saved_bytes = (a.memory_gib_per_rank[0] - b.memory_gib_per_rank[0]) * 2**30
    assert saved_bytes == pytest.approx(2 * GPT.total_params(), rel=1e-3)
    assert b.step_s < a.step_s


def test_plan_file_and_megatron_export_carry_it(profile, tmp_path):
    plan = search(GPT, SHAPE, ClusterSpec(num_gpus=2), profile, Pins(dp=2, grad_dtype="bf16"), top_k=1).plans[0]
    path = tmp_path / "p.json"
    plan.save(path)
    assert Plan.load(path).layout.grad_dtype == "bf16"
    assert "--accumulate-allreduce-grads-in-fp32" not in megatron_args(plan).args
    fp32 = replace(plan, layout=replace(plan.layout, grad_dtype="fp32"))
    assert "--accumulate-allreduce-grads-in-fp32" in megatron_args(fp32).args
    d = json.loads(path.read_text())
    d["layout"]["grad_dtype"] = "fp16"
    with pytest.raises(PlanError, match="gradient precision 'fp16' is not one of fp32, bf16"):
        Plan.from_dict(d)
