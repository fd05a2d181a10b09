"""The host floor: a virtual stage takes max(GPU time, host time) per micro-batch, with the host time
counted from the profile's measured per-layer figures (hand-computed cases)."""
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.model import resolve_model
from planner.plan import Layout, StagePlan, TrainingShape
from planner.profile import HostOverheads, Profile, load_profile

HOST = HostOverheads(layer_s={"none": 1e-3, "selective": 1.2e-3, "full": 1.5e-3},
                     tp_extra_s={"none": 4e-4, "selective": 5e-4, "full": 6e-4},
                     cp_extra_s=2e-4, fsdp_extra_s=3e-4, expert_s=5e-5, ep_extra_s=7e-4, pp_chunk_s=9e-4)


def _cm(lay, host=HOST, seq=2048, gb=8, model="gpt-1.3b"):
    prof = replace(load_profile("h200-sxm", "h200-sxm"), host=host)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
    spec = resolve_model(model) if isinstance(model, str) else model
    return CostModel(spec, TrainingShape(seq, gb), lay, cluster, prof)


def test_host_time_of_a_mixed_stage_by_hand():
    cm = _cm(Layout(tp=2, pp=2, cp=2, micro_batch=1, sharding="optimizer"))
    st = StagePlan(layers=6, full_recompute_layers=2, selective_recompute_layers=1)
    per = lambda mode: HOST.layer_s[mode] + HOST.tp_extra_s[mode] + HOST.cp_extra_s  # noqa: E731
    want = 3 * per("none") + 2 * per("full") + 1 * per("selective") + HOST.pp_chunk_s
    assert cm.stage_host_s(0, st) == pytest.approx(want)
    ends = replace(HOST, ends_s=2e-3, family_ends_s={"gpt": 3e-3})
    cm = _cm(Layout(tp=2, pp=2, cp=2, micro_batch=1, sharding="optimizer"), host=ends)
    assert cm.stage_host_s(0, st) == pytest.approx(want)               # first stage: no head
    assert cm.stage_host_s(1, st) == pytest.approx(want + 3e-3)        # last stage: the gpt family's ends


def test_moe_and_fsdp_terms():
    cm = _cm(Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer"), model="mixtral-8x7b", seq=1024)
    st = StagePlan(layers=2)
    assert cm.stage_host_s(0, st) == pytest.approx(2 * (HOST.layer_s["none"] + 8 * HOST.expert_s + HOST.ep_extra_s))
    cm = _cm(Layout(dp=2, micro_batch=1, sharding="full"))
    assert cm.stage_host_s(0, st) == pytest.approx(2 * (HOST.layer_s["none"] + HOST.fsdp_extra_s))


def test_stage_time_is_the_larger_of_gpu_and_host():
    lay = Layout(tp=2, micro_batch=1, sharding="none")
    st = StagePlan(layers=24)
    gpu = _cm(lay, host=None).stage_time_s(0, st)
    assert _cm(lay, host=None).stage_host_s(0, st) == 0.0
    slow = replace(HOST, layer_s={"none": gpu, "selective": gpu, "full": gpu})  # 24x the whole stage's GPU time
    cm = _cm(lay, host=slow)
    assert cm.stage_time_s(0, st) == pytest.approx(cm.stage_host_s(0, st))
    assert cm.stage_time_s(0, st) > 20 * gpu
    pred = cm.predict([st])
    assert pred.breakdown_s["host"] == pytest.approx(8 * (cm.stage_host_s(0, st) - cm.stage_gpu_s(0, st)))
    fast = replace(HOST, layer_s={"none": 0.0, "selective": 0.0, "full": 0.0}, tp_extra_s={})
    assert _cm(lay, host=fast).stage_time_s(0, st) == pytest.approx(gpu)


def test_profile_roundtrip_and_corrupt_host():
    prof = replace(load_profile("h200-sxm", "h200-sxm"), host=HOST)
    back = Profile.from_dict(prof.to_dict())
    assert back.host == HOST
    d = prof.to_dict()
    d["host"]["layer_s"]["none"] = -1.0
    from planner.errors import PlanError
    with pytest.raises(PlanError, match="host overhead"):
        Profile.from_dict(d)


def test_family_base_replaces_the_default():
    fam = replace(HOST, family_layer_s={"gpt": {"none": 5e-4, "selective": 6e-4, "full": 7e-4}})
    st = StagePlan(layers=4)
    gpt = _cm(Layout(micro_batch=1, sharding="none"), host=fam)
    assert gpt.stage_host_s(0, st) == pytest.approx(4 * 5e-4)
    llama = _cm(Layout(micro_batch=1, sharding="none"), host=fam, model="llama3-8b")
    assert llama.stage_host_s(0, st) == pytest.approx(4 * HOST.layer_s["none"])  # no llama entry: the default
    assert Profile.from_dict(replace(load_profile("h200-sxm", "h200-sxm"), host=fam).to_dict()).host == fam


def test_moe_expert_host_time_adds_to_the_gpu_time_only_under_ep():
    """EP > 1 synchronises the host every MoE layer (the all-to-all split sizes): the experts' host time comes
    on top of the GPU time. EP1 does not: its host time is a floor like a dense layer's."""
    lay = Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer")
    st = StagePlan(layers=2)
    cm = _cm(lay, model="mixtral-8x7b", seq=1024)
    expert = 2 * 8 * HOST.expert_s  # the probe's MoE layer (8 experts): grouped GEMMs, whatever the local experts
    assert cm.stage_expert_host_s(st) == pytest.approx(expert)
    want = max(cm.stage_gpu_s(0, st), cm.stage_host_s(0, st) - expert) + expert
    assert cm.stage_time_s(0, st) == pytest.approx(want)
    ep1 = _cm(Layout(dp=2, micro_batch=1, sharding="optimizer"), model="mixtral-8x7b", seq=1024)
    assert ep1.stage_expert_host_s(st) == 0.0
    assert ep1.stage_host_s(0, st) == pytest.approx(2 * (HOST.layer_s["none"] + 8 * HOST.expert_s))
    assert ep1.stage_time_s(0, st) == pytest.approx(max(ep1.stage_gpu_s(0, st), ep1.stage_host_s(0, st)))
    assert _cm(Layout(micro_batch=1, sharding="none")).stage_expert_host_s(st) == 0.0  # dense
    # grouped expert GEMMs: the MoE layer's host time does not grow with the expert count
    fine = replace(resolve_model("mixtral-8x7b"), name="mixtral-64e", num_experts=64)
    many = _cm(Layout(dp=2, micro_batch=1, sharding="optimizer"), model=fine, seq=1024)
    assert many.stage_host_s(0, st) == pytest.approx(ep1.stage_host_s(0, st))


def test_layer_check_takes_the_host_floor_as_the_planner_does():
    """benchmarks/profile_accuracy.py's per-layer prediction is max(GPU time, host time), by hand."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from profile_accuracy import _layer_prediction

    slow_host = HostOverheads(layer_s={"none": 1.0}, tp_extra_s={"none": 0.5})  # seconds: far above any GPU time
    prof = replace(load_profile("h200-sxm", "h200-sxm"), host=slow_host)
    pred = _layer_prediction(prof, resolve_model("gpt-1.3b"), 4, 2048, tp=2)
    assert pred["host_s"] == pytest.approx(1.5) and pred["total_s"] == pytest.approx(1.5)
    assert pred["gpu_s"] < 0.1
    fast = _layer_prediction(replace(prof, host=None), resolve_model("gpt-1.3b"), 4, 2048, tp=2)
    assert fast["total_s"] == pytest.approx(fast["gpu_s"]) == pytest.approx(pred["gpu_s"])


def test_host_figures_out_of_recompute_order_are_named():
    ok = HostOverheads(layer_s={"none": 1e-3, "selective": 1.2e-3, "full": 1.5e-3}, tp_extra_s={})
    assert ok.recompute_order_violations() == []
    bad = HostOverheads(layer_s={"none": 1e-3, "selective": 1.2e-3, "full": 1.5e-3}, tp_extra_s={},
                        family_layer_s={"llama": {"none": 2.3e-3, "selective": 5.1e-3, "full": 3.8e-3}})
    (msg,) = bad.recompute_order_violations()
    assert msg.startswith("llama:") and "selective 5.10" in msg


def test_plan_provenance_carries_the_profile_warning():
    from planner.search import plan_provenance

    # the probe shipped on 2026-11-30 had llama's selective (5.1 ms) above its full recompute (3.8 ms)
    noisy = replace(HOST, family_layer_s={"llama": {"none": 2.3e-3, "selective": 5.1e-3, "full": 3.8e-3}})
    prov = plan_provenance(replace(load_profile("h200-sxm", "h200-sxm"), host=noisy))
    assert any("llama" in w and "recompute order" in w for w in prov["profile_warnings"])
    assert plan_provenance(replace(load_profile("h200-sxm", "h200-sxm"), host=HOST))["profile_warnings"] == []
    clean = replace(load_profile("h200-sxm", "h200-sxm"), host=None)
    assert plan_provenance(clean)["profile_warnings"] == []


def _gpt_host(single_rank_layer_s: float):
    """The host model with gpt's figures: a DP2 base of 1.0 ms (none), 1.2 ms (selective), 1.5 ms (full) per layer and
    2 ms for the ends; a single rank's layer at `single_rank_layer_s`, its ends at 1.5 ms."""
    return replace(HOST, family_layer_s={"gpt": {"none": 1e-3, "selective": 1.2e-3, "full": 1.5e-3}},
                   family_ends_s={"gpt": 2e-3}, family_single_rank_layer_s={"gpt": single_rank_layer_s},
                   family_single_rank_ends_s={"gpt": 1.5e-3})


def test_plans_without_a_data_parallel_group_drop_the_reduction_host_time():
    # DP2 base gpt 1.0 ms none / 1.5 ms full; one rank alone 0.7 ms: the hooks cost 0.3 ms per layer
    fam = _gpt_host(single_rank_layer_s=7e-4)
    st = StagePlan(layers=4, full_recompute_layers=1)
    one_gpu = _cm(Layout(micro_batch=1, sharding="none"), host=fam)
    assert one_gpu.stage_host_s(0, st) == pytest.approx(3 * 7e-4 + 1 * 1.2e-3 + 1.5e-3)
    tp2 = _cm(Layout(tp=2, micro_batch=1, sharding="none"), host=fam)     # still no data-parallel group
    assert tp2.stage_host_s(0, st) == pytest.approx(3 * (7e-4 + 4e-4) + (1.2e-3 + 6e-4) + 1.5e-3)
    dp2 = _cm(Layout(dp=2, micro_batch=1, sharding="optimizer"), host=fam)
    assert dp2.stage_host_s(0, st) == pytest.approx(3 * 1e-3 + 1.5e-3 + 2e-3)
    cp2 = _cm(Layout(cp=2, micro_batch=1, sharding="optimizer"), host=fam)  # CP ranks reduce gradients too
    assert cp2.stage_host_s(0, st) == pytest.approx(3 * (1e-3 + 2e-4) + (1.5e-3 + 2e-4) + 2e-3)
    # no single-rank figure for llama: nothing taken off; and the fields survive the JSON round trip
    llama = _cm(Layout(micro_batch=1, sharding="none"), host=fam, model="llama3-8b")
    assert llama.stage_host_s(0, StagePlan(layers=2)) == pytest.approx(2 * HOST.layer_s["none"] + HOST.ends_s)
    assert Profile.from_dict(replace(load_profile("h200-sxm", "h200-sxm"), host=fam).to_dict()).host == fam


def test_a_single_rank_figure_above_the_base_prices_single_rank_plans():
    # the single-rank probe measured 1.6 ms against a DP2 base of 1.0 ms (another machine's, or the probe's
    # noise): a plan without data parallelism is priced at 1.6 ms per layer, its recompute modes shifted alike
    fam = _gpt_host(single_rank_layer_s=1.6e-3)
    st = StagePlan(layers=4, full_recompute_layers=1)
    one_gpu = _cm(Layout(micro_batch=1, sharding="none"), host=fam)
    assert one_gpu.stage_host_s(0, st) == pytest.approx(3 * 1.6e-3 + 1 * 2.1e-3 + 1.5e-3)
    dp2 = _cm(Layout(dp=2, micro_batch=1, sharding="optimizer"), host=fam)  # the base, untouched
    assert dp2.stage_host_s(0, st) == pytest.approx(3 * 1e-3 + 1.5e-3 + 2e-3)
