"""The h100-96gb GPU kind (H100 SXM with 96 GB HBM2e at 2.4 TB/s, torchtitan's benchmark GPU) and its profile,
derived from the measured H100 SXM one by runtime/profiler/derive.py's HBM scaling (profiles/build_h100_96gb_profile.py)."""
from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from planner.cluster import GPU_KINDS
from planner.cost.targets import load_target
from planner.errors import NoFitError
from planner.profile import load_profile
from tests.planner.conftest import REPO, run_cli


@pytest.fixture(scope="module")
def profiles():
    return {g: load_profile(None, g) for g in ("h100-96gb", "h100-sxm")} | {"h200-sxm": load_profile("h200-sxm", "h200-sxm")}


def test_kind_is_h100_sxm_with_96gb_hbm2e():
    k, h100 = GPU_KINDS["h100-96gb"], GPU_KINDS["h100-sxm"]
    assert k.memory_gib == 96.0        # 98304 MiB nominal
    assert k.hbm_tb_per_s == 2.4
    assert (k.peak_bf16_tflops, k.nvlink_gb_per_s) == (h100.peak_bf16_tflops, h100.nvlink_gb_per_s)


def test_kind_plans_from_the_cli():
    rc, out, err = run_cli("--model", "llama3-8b", "--gpus", "128", "--gpu", "h100-96gb")
    assert rc == 0, err
    assert "profiles/h100-96gb.json" in out and "power_limit: not modelled" in out
    rc, out, _ = run_cli("--help")
    assert "h100-96gb" in out


def test_profile_is_labelled_modelled_and_derived(profiles):
    prof = profiles["h100-96gb"]
    prov = prof.provenance
    assert prof.gpu == "h100-96gb" and prov["kind"] == "modelled (derived)"
    assert prov["derived_from_gpu"] == "h100-sxm" and "not measured" in prov["gpu_name"]
    statuses = {p["part"]: p["status"] for p in prov["parts"]}
    assert set(statuses.values()) <= {"derived", "modelled", "not modelled"}
    assert statuses["power_limit"] == "not modelled" and statuses["grouped_gemm"] == "derived"
    assert not any(c.measured for c in prof.collectives)
    assert prof.grouped_points == profiles["h100-sxm"].grouped_points and prof.grouped_points
    # a graphed step's per-kernel time: the one fitted on the H100's runs (the calibrated h100-sxm default)
    assert prof.graph_kernel_s == profiles["h100-sxm"].graph_kernel_s is not None
    assert "graph_kernel_s" in statuses and load_profile(None, "h800").graph_kernel_s == prof.graph_kernel_s


def test_gemm_scaled_by_hbm_share_by_hand(profiles):
    """derive.py: t' = t (1 + phi (r - 1)), phi = min(1, (2 (mk + kn) + 2 mn) bytes / H100 copy bandwidth / t),
    r = 3.35 / 2.4; memory-bound shapes come out slower than the measured 3.35 TB/s h100-sxm, compute-bound ones
    equal."""
    h100 = {(m, n, k): t for m, n, k, t in profiles["h100-sxm"].gemm_points}
    h96 = {(m, n, k): t for m, n, k, t in profiles["h100-96gb"].gemm_points}
    assert h96.keys() == h100.keys()
    bw = profiles["h100-sxm"].copy_bandwidth_bytes_per_s
    r = 3.35 / 2.4
    assert profiles["h100-96gb"].copy_bandwidth_bytes_per_s == pytest.approx(bw / r)
    phi = {s: min(1.0, (2.0 * (s[0] * s[2] + s[2] * s[1]) + 2.0 * s[0] * s[1]) / bw / t) for s, t in h100.items()}
    memory_bound = [s for s in h96 if phi[s] > 0.5]
    assert memory_bound
    assert all(h96[s] > h100[s] for s in memory_bound)
    # one point by hand: the most memory-bound shape
    s = max(memory_bound, key=phi.get)
    m, n, k = s
    traffic_bytes = 2 * (m * k + k * n) + 2 * m * n
    share = min(1.0, traffic_bytes / bw / h100[s])
    assert h96[s] == pytest.approx(h100[s] * (1 + share * (r - 1)), rel=1e-12)
    big = max(h100, key=lambda s: s[0] * s[1] * s[2])
    assert phi[big] < 0.1 and h96[big] == pytest.approx(h100[big] * (1 + phi[big] * (r - 1)), rel=1e-12)


def test_titan24_07_layout_as_run_fits_96gb_not_80gb(profiles):
    """torchtitan's 405B, FSDP 8 x TP 8 x PP 8, interleaved 1F1B (Table 5) ran on 96 GB H100s: its pinned layout
    fits under the 96 GB kind's limit, and does not fit an 80 GB h100-sxm."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_rows as pr
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    row = {r.row_id: r for r in pr.load_rows()}["titan24-07"]
    assert row.cluster.gpu == "h100-96gb" and (row.pins.tp, row.pins.pp, row.pins.vpp) == (8, 8, 2)
    meg = load_target("megatron")
    plan = pr.plan_row(row, meg)
    p = plan.prediction
    assert max(p.memory_gib_per_rank) <= p.memory_limit_gib < 96.0
    on_80gb = replace(row, cluster=replace(row.cluster, gpu="h100-sxm"))
    with pytest.raises(NoFitError):
        pr.plan_row(on_80gb, meg, profile=profiles["h100-sxm"])
