"""The plan file: round trip through to_dict/from_dict and save/load; tampered files refused."""
from __future__ import annotations

import json

import pytest

from planner.cluster import ClusterSpec
from planner.errors import PlanError
from planner.model import tiny_model
from planner.plan import Plan, TrainingShape
from planner.search import Pins, search


@pytest.fixture(scope="module")
def plan(profile):
    model = tiny_model("llama", num_layers=8, num_experts=4, top_k=2)
    res = search(model, TrainingShape(32, 16), ClusterSpec(num_gpus=8, gpus_per_node=8), profile,
                 Pins(pp=2, vpp=2, ep=2), top_k=1)
    return res.plans[0]


def test_round_trip_dict(plan):
    d = plan.to_dict()
    back = Plan.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d
    assert back.layout == plan.layout and back.stages == plan.stages and back.model == plan.model


def test_save_load(plan, tmp_path):
    p = tmp_path / "plan.json"
    plan.save(p)
    assert Plan.load(p).to_dict() == plan.to_dict()
    with pytest.raises(PlanError, match="already exists; pass --force"):
        plan.save(p)
    plan.save(p, overwrite=True)


def _tampered(plan, edit):
    d = json.loads(json.dumps(plan.to_dict()))
    edit(d)
    return d


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(format="something/else"), "not a parallel-plan plan"),
    (lambda d: d.update(version=99), "has plan version 99, which is not supported"),
    (lambda d: d.pop("layout"), "lacks the field 'layout'"),
    (lambda d: d["layout"].update(ep=3), "4 experts are not divisible by EP 3"),
    (lambda d: d["layout"].update(tp=3), "does not equal the 8 GPUs"),
    (lambda d: d["layout"].update(bogus=1), "malformed section"),
    (lambda d: d["stages"][0].update(layers=d["stages"][0]["layers"] + 1), "stages hold 9 layers, the model has 8"),
    (lambda d: d["stages"][1].update(full_recompute_layers=99), "recomputes more layers than it holds"),
    (lambda d: d["model"].update(num_heads=5), "not divisible"),
    (lambda d: d["model"].update(secret=1), "unknown fields"),
    (lambda d: d["cluster"].update(num_gpus=16), "does not equal the 16 GPUs"),
])
def test_tampered_plan_refused(plan, edit, needle):
    with pytest.raises(PlanError) as e:
        Plan.from_dict(_tampered(plan, edit))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unreadable_plan_files(tmp_path):
    p = tmp_path / "plan.json"
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(p)
    p.write_text("{broken")
    with pytest.raises(PlanError, match="is not readable JSON"):
        Plan.load(p)


def test_the_default_profile_is_the_calibrated_one_where_it_ships():
    from planner.profile import default_profile_path, load_profile, shipped_profile_path
    assert default_profile_path("h200-sxm") == shipped_profile_path("h200-sxm-calibrated")
    assert load_profile(None, "h200-sxm").provenance.get("calibrations")
    assert default_profile_path("h100-sxm") == shipped_profile_path("h100-sxm-calibrated")
    assert default_profile_path("h100-96gb") == shipped_profile_path("h100-96gb")  # no calibrated one ships


ROTARY_AND_NORM_FIELDS = ("rope_theta", "norm_eps", "rope_scaling_factor", "rope_low_freq_factor",
                          "rope_high_freq_factor", "rope_original_max_positions", "unapplied_rope_scaling")


def test_a_plan_written_before_the_rotary_and_norm_fields_loads(plan):
    """A plan file from before the model spec had a rotary base, norm epsilon and rope scaling loads with what the
    runtime used then: theta 10000, no scaling, eps 1e-5, and BERT's 1e-12."""
    from planner.plan import Layout, even_stages
    d = json.loads(json.dumps(plan.to_dict()))
    assert set(ROTARY_AND_NORM_FIELDS) <= set(d["model"])
    for k in ROTARY_AND_NORM_FIELDS:
        del d["model"][k]
    m = Plan.from_dict(d).model
    assert (m.rope_theta, m.norm_eps, m.rope_scaling_factor, m.rope_original_max_positions,
            m.unapplied_rope_scaling) == (10000.0, 1e-5, 0.0, 0, "")
    assert m == plan.model
    bert = Plan(model=tiny_model("bert"), cluster=ClusterSpec(num_gpus=1, gpus_per_node=1).to_dict(),
                training=TrainingShape(32, 8), layout=Layout(sharding="none"), stages=even_stages(4, 1)).to_dict()
    for k in ROTARY_AND_NORM_FIELDS:
        del bert["model"][k]
    assert Plan.from_dict(bert).model.norm_eps == 1e-12


def test_a_plan_written_before_qk_norm_loads_without_it(plan):
    """A plan file from before the model spec had Qwen3's q/k norms loads as the model it described: none. A plan of a
    model with them keeps them through the file."""
    import dataclasses
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["model"]["qk_norm"] is False
    del d["model"]["qk_norm"]
    m = Plan.from_dict(d).model
    assert m.qk_norm is False and m == plan.model
    qk = dataclasses.replace(plan, model=dataclasses.replace(plan.model, qk_norm=True))
    assert Plan.from_dict(json.loads(json.dumps(qk.to_dict()))).model.qk_norm is True
