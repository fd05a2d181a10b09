"""Grouped GEMMs (planner/profile/grouped.py, Profile.grouped_gemm_s): the measured grouped-over-dense ratio read at
the rows per expert a layout gives, by hand; the cost model's use of it for the MoE experts; the profile format."""
import json
from pathlib import Path
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.errors import PlanError
from planner.model import resolve_model
from planner.plan import Layout, TrainingShape
from planner.profile import Profile, load_profile
from planner.profile.grouped import GroupedGemmPoint, dense_equivalent, grouped_over_dense

REPO = Path(__file__).resolve().parents[3]
BASE = load_profile(None, "h200-sxm")
N, K = 1536, 2048


def _series(direction="fwd", experts=8, n=N, k=K, ratios=((64, 3.0), (256, 1.5), (1024, 1.0))):
    return [GroupedGemmPoint(direction, experts, rows, n, k, grouped_s=q * 1e-4, dense_s=1e-4) for rows, q in ratios]


def _with(points) -> Profile:
    return replace(BASE, grouped_points=list(points))


def test_ratio_interpolates_in_log_rows_and_clamps():
    pts = tuple(_series())
    assert grouped_over_dense(pts, "fwd", 8, 256, N, K) == (1.5, 256)
    assert grouped_over_dense(pts, "fwd", 8, 128, N, K) == (pytest.approx(2.25), 128)   # halfway in log2
    assert grouped_over_dense(pts, "fwd", 8, 512, N, K) == (pytest.approx(1.25), 512)
    assert grouped_over_dense(pts, "fwd", 8, 4096, N, K) == (1.0, 4096)   # above: the largest's ratio
    assert grouped_over_dense(pts, "fwd", 8, 16, N, K) == (3.0, 64)       # below: the smallest's time
    assert grouped_over_dense(pts, "dgrad", 8, 256, N, K) is None


def test_nearest_shape_then_nearest_expert_count():
    pts = tuple(_series(experts=8, ratios=((256, 1.5),)) + _series(experts=64, ratios=((256, 1.2),))
                + _series(experts=8, n=8192, k=8192, ratios=((256, 1.05),)))
    assert grouped_over_dense(pts, "fwd", 6, 256, 1024, 2048)[0] == 1.5     # shape (1536, 2048), 8 experts
    assert grouped_over_dense(pts, "fwd", 128, 256, 1024, 2048)[0] == 1.2   # 64 experts is nearer 128
    assert grouped_over_dense(pts, "fwd", 8, 256, 7168, 7168)[0] == 1.05    # the large shape


def test_price_is_ratio_times_the_profiles_dense_gemm_of_all_rows():
    prof = _with(_series("fwd") + _series("dgrad") + _series("wgrad"))
    launch = prof.gemm_launch_s
    for direction in ("fwd", "dgrad", "wgrad"):
        table, m, n, k = dense_equivalent(direction, 8 * 128, N, K)
        dense = prof.gemm_table_s(table, m, n, k) - launch
        assert prof.grouped_gemm_s(direction, 8, 128, N, K) == pytest.approx(2.25 * dense + launch, rel=1e-12)
    # fewer rows than measured cost what the smallest measured costs
    assert prof.grouped_gemm_s("fwd", 8, 8, N, K) == pytest.approx(prof.grouped_gemm_s("fwd", 8, 64, N, K))
    assert dense_equivalent("dgrad", 100, N, K) == ("mm", 100, K, N)
    assert dense_equivalent("wgrad", 100, N, K) == ("wgrad", N, K, 100)


def test_cost_model_prices_experts_from_the_grouped_table():
    """With every ratio 1, the experts cost the dense GEMMs of all their rows (one launch per call); the
    per-expert fallback charges a small GEMM per expert, which at 128 rows per expert (Qwen3-30B-A3B: 128 experts,
    top 8, 2048 tokens) is several times dearer."""
    spec = resolve_model(str(REPO / "benchmarks/models/qwen3-30b-a3b"))
    f, h = spec.ffn_hidden, spec.hidden
    ones = [GroupedGemmPoint(d, 128, r, n, k, 1e-4, 1e-4) for d in ("fwd", "dgrad", "wgrad") for r in (16, 8192)
            for n, k in ((2 * f, h), (h, f))]
    prof = _with(ones)
    lay = Layout(dp=2, ep=1, micro_batch=1)
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2)
    cm = CostModel(spec, TrainingShape(2048, 8), lay, cl, prof)
    experts, rows = 128, cm.expert_gemm_rows
    assert rows == 128
    fwd, bwd = cm._grouped_gemm_fwd_bwd_s(experts, rows, 2 * f, h)
    table_fwd, table_bwd = cm._gemm_fwd_bwd_s(experts * rows, 2 * f, h)
    assert fwd == pytest.approx(table_fwd, rel=1e-12)
    assert bwd == pytest.approx(table_bwd, rel=1e-12)
    old = CostModel(spec, TrainingShape(2048, 8), lay, cl, _with([]))._grouped_gemm_fwd_bwd_s(experts, rows, 2 * f, h)
    assert old[0] > 3 * fwd and old[1] > 3 * bwd


def test_round_trip_and_corrupted_points(tmp_path):
    prof = _with(_series())
    path = tmp_path / "p.json"
    prof.save(path)
    back = Profile.load(path)
    assert back.grouped_points == prof.grouped_points
    d = json.loads(path.read_text())
    d["grouped_gemm"]["points"][1]["direction"] = "sideways"
    path.write_text(json.dumps(d))
    with pytest.raises(PlanError, match=r"grouped_gemm.points\[1\].direction is 'sideways'"):
        Profile.load(path)
    d["grouped_gemm"]["points"][1].update(direction="fwd", dense_s=0)
    path.write_text(json.dumps(d))
    with pytest.raises(PlanError, match=r"grouped_gemm.points\[1\].dense_s is 0"):
        Profile.load(path)
    del d["grouped_gemm"]["points"][1]["rows"]
    path.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="is corrupted"):
        Profile.load(path)


def test_fp8_experts_price_the_fp8_dense_gemm_at_the_grouped_ratio():
    """A target whose experts run in FP8 (RuntimeTarget.fp8_experts; Megatron's TE GroupedLinear) prices an FP8
    layout's grouped GEMMs as the FP8 dense GEMM of all their rows at the measured grouped ratio, times its FP8
    factor (wgrad too where its wgrad is FP8); ours keeps them in bf16 whatever the layout."""
    from planner.cost.targets import OURS, RuntimeTarget

    prof = _with(_series("fwd") + _series("dgrad") + _series("wgrad"))
    fp8_target = RuntimeTarget("t", fp8_experts=True, fp8_wgrad=True, fp8_gemm_factor=0.8)
    spec = resolve_model("mixtral-8x7b")
    lay = Layout(dp=2, ep=2, micro_batch=1, fp8=True)
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2)
    cm = CostModel(spec, TrainingShape(2048, 8), lay, cl, prof, target=fp8_target)
    fwd, bwd = cm._grouped_gemm_fwd_bwd_s(8, 128, N, K)
    launch = prof.gemm_launch_s

    def fp8(direction):
        _, m, n, k = dense_equivalent(direction, 8 * 128, N, K)
        return 0.8 * (2.25 * (prof.gemm_table_s("fp8", m, n, k) - launch) + launch)
    assert fwd == pytest.approx(fp8("fwd"), rel=1e-12)
    assert bwd == pytest.approx(fp8("dgrad") + fp8("wgrad"), rel=1e-12)
    bf16 = CostModel(spec, TrainingShape(2048, 8), lay, cl, prof, target=OURS)._grouped_gemm_fwd_bwd_s(8, 128, N, K)
    assert bf16 == (pytest.approx(prof.grouped_gemm_s("fwd", 8, 128, N, K), rel=1e-12),
                    pytest.approx(prof.grouped_gemm_s("dgrad", 8, 128, N, K)
                                  + prof.grouped_gemm_s("wgrad", 8, 128, N, K), rel=1e-12))
    no_fp8 = CostModel(spec, TrainingShape(2048, 8), replace(lay, fp8=False), cl, prof, target=fp8_target)
    assert no_fp8._grouped_gemm_fwd_bwd_s(8, 128, N, K) == pytest.approx(bf16, rel=1e-12)
