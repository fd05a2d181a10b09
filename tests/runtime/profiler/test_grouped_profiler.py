"""runtime/profiler/grouped.py on CPU: the grid it times, the points it adds to a profile (read back by the
planner), the derived copy's label, and its refusals."""
from __future__ import annotations

import torch

from planner.profile import Profile, shipped_profile_path
from planner.profile.grouped import GROUPED_DIRECTIONS
from runtime.profiler import grouped


def test_grid_respects_expert_counts_and_caps():
    spec = grouped.GridSpec(rows=(4, 16, 64), max_weight_bytes=6 * 8 * 64 * 32, max_rows_total=256)
    g = grouped.grid([(16, 64, 32)], spec)
    assert {e for e, *_ in g} == {4, 1}           # 16 experts' weights exceed the cap; ep 4 and 16 fit
    assert all(e * m <= 256 for e, m, *_ in g)
    assert (4, 64, 64, 32) in g and (1, 64, 64, 32) in g


def test_grouped_calls_compute_what_the_dense_ones_do():
    """The grouped and dense calls run the same GEMM on expert 0's rows (the dense calls take expert 0's weight):
    forward and dgrad agree there, so the timed pairs compare like with like."""
    g, m, n, k = 3, 5, 8, 16
    calls = grouped._calls(g, m, n, k, torch.device("cpu"), torch.float32)
    fwd_grouped, fwd_dense = (c(0) for c in calls["fwd"])
    assert fwd_grouped.shape == fwd_dense.shape == (g * m, n)
    assert torch.allclose(fwd_grouped[:m], fwd_dense[:m], atol=1e-5)   # expert 0's rows use the same weight
    dgrad_grouped, dgrad_dense = (c(0) for c in calls["dgrad"])
    assert torch.allclose(dgrad_grouped[:m], dgrad_dense[:m], atol=1e-5)


def test_adds_points_the_planner_reads_and_refuses_an_existing_output(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = grouped.main(["--profile", "h200-sxm", "--out", str(out), "--device", "cpu", "--shape", "4,64,32"])
    assert rc == 0, capsys.readouterr().err
    prof = Profile.load(out)
    assert {p.direction for p in prof.grouped_points} == set(GROUPED_DIRECTIONS)
    assert {(p.n, p.k) for p in prof.grouped_points} == {(64, 32)}
    assert all(p.grouped_s > 0 and p.dense_s > 0 for p in prof.grouped_points)
    part = [p for p in prof.provenance["parts"] if p["part"] == "grouped_gemm"]
    assert len(part) == 1 and part[0]["status"] == "measured"
    assert prof.grouped_gemm_s("fwd", 4, 16, 64, 32) > 0
    before = out.read_bytes()
    assert grouped.main(["--profile", "h200-sxm", "--out", str(out), "--device", "cpu", "--shape", "4,64,32"]) == 2
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == before
    # a derived profile copies the points and says so
    derived = tmp_path / "d.json"
    assert grouped.main(["--profile", "h100-sxm", "--out", str(derived), "--copy-from", str(out)]) == 0
    d = Profile.load(derived)
    assert d.gpu == "h100-sxm" and d.grouped_points == prof.grouped_points
    assert [p["status"] for p in d.provenance["parts"] if p["part"] == "grouped_gemm"] == ["derived"]


def test_bad_shape_and_nothing_to_copy(tmp_path, capsys):
    assert grouped.main(["--profile", "h200-sxm", "--out", str(tmp_path / "a.json"), "--device", "cpu",
                         "--shape", "4,x,32"]) == 2
    err = capsys.readouterr().err
    assert "is not EXPERTS,N,K" in err and "Traceback" not in err
    from dataclasses import replace
    bare = tmp_path / "bare.json"
    replace(Profile.load(shipped_profile_path("h200-sxm")), grouped_points=[]).save(bare)
    assert grouped.main(["--profile", "h100-sxm", "--out", str(tmp_path / "b.json"), "--copy-from", str(bare)]) == 2
    assert "has no grouped GEMMs to copy" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()
