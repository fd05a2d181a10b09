"""End to end on CPU (gloo): `plan profile --device cpu` writes a profile the planner loads and queries."""
import json

import pytest

from planner.errors import PlanError
from planner.profile import Profile
from runtime.profiler import cli


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "cpu.json"
    rc = cli.main(["--device", "cpu", "--quick", "--gpus", "2", "--out", str(out), "--no-progress"])
    assert rc == 0
    return out


def test_cpu_profile_loads_and_answers(cpu_profile):
    p = Profile.load(cpu_profile)
    assert p.gpu == "cpu"
    assert p.gemm_points and p.attention_points
    measured = {(c.op, c.group_size) for c in p.collectives if c.measured}
    assert {("all_reduce", 2), ("all_gather", 2), ("reduce_scatter", 2), ("all_to_all", 2),
            ("send_recv", 2)} <= measured
    assert all(c.link == "loopback" for c in p.collectives)
    assert p.gemm_s(64, 192, 64) > 0
    assert p.attention_s(2, 4, 32, 32, 16, True, False) > 0
    assert p.attention_s(2, 4, 32, 32, 16, True, True) > 0
    assert p.memory_bound_s(1 << 20) > 0
    assert p.collective_s("all_reduce", 1 << 20, 2, "loopback") > 0
    assert p.collective_s("all_gather", 1 << 20, 4, "loopback") > 0   # modelled group, written out
    assert 0 < p.optimizer_s_per_param and 0 < p.elementwise_efficiency <= 1
    assert set(p.overlap_hidden_fraction) == {"tp", "dp", "pp", "cp", "ep"}


def test_cpu_profile_provenance(cpu_profile):
    d = json.loads(cpu_profile.read_text())
    prov = d["provenance"]
    for key in ("date", "torch", "git_commit", "topology", "parts", "environment_forced", "gpu_name"):
        assert key in prov, key
    assert prov["environment_forced"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    statuses = {p["part"]: p["status"] for p in prov["parts"]}
    assert statuses["gemm"] == "measured" and statuses["collectives/loopback"] == "measured"
    assert any(s == "modelled" for s in statuses.values())
    assert len(d["extras"]["gemm_spread"]) == len(d["gemm"]["points"])
    assert len(d["extras"]["wgrad_spread"]) == len(d["gemm"]["wgrad_points"]) > 0
    sus = d["extras"]["sustained_gemm"]   # the diagnostic: one GEMM in bursts and back to back
    assert sus["burst_s"] > 0 and sus["sustained_s"] > 0 and sus["calls"] > 0
    assert sus["sustained_over_burst"] == pytest.approx(sus["sustained_s"] / sus["burst_s"])


def test_overwrite_refused_then_forced(cpu_profile, tmp_path, capsys):
    before = cpu_profile.read_bytes()
    rc = cli.main(["--device", "cpu", "--quick", "--out", str(cpu_profile), "--no-progress"])
    assert rc == 1
    err = capsys.readouterr().err
    assert str(cpu_profile) in err and "--force" in err
    assert cpu_profile.read_bytes() == before
    # --force overwrites (one process: no collectives spawned, so this is quick)
    other = tmp_path / "one.json"
    other.write_text("placeholder")
    rc = cli.main(["--device", "cpu", "--quick", "--gpus", "1", "--out", str(other), "--force", "--no-progress"])
    assert rc == 0
    assert Profile.load(other).gpu == "cpu"


def test_bad_input_is_one_sentence(tmp_path, capsys):
    assert cli.main(["--device", "cpu", "--gpus", "0", "--out", str(tmp_path / "x.json")]) == 1
    assert "--gpus must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_corrupted_profile_named(cpu_profile, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(cpu_profile.read_text()[:500])          # truncated
    with pytest.raises(PlanError, match="bad.json"):
        Profile.load(bad)
    d = json.loads(cpu_profile.read_text())
    del d["gemm"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="broken.json.*corrupted"):
        Profile.load(broken)
    d = json.loads(cpu_profile.read_text())
    d["format"] = "something-else"
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="foreign.json"):
        Profile.load(foreign)


def test_derive_h100(cpu_profile, tmp_path, capsys):
    from runtime.profiler import derive
    d = json.loads(cpu_profile.read_text())
    d["gpu"] = "h200-sxm"
    src = tmp_path / "h200.json"
    src.write_text(json.dumps(d))
    out = tmp_path / "h100.json"
    assert derive.main([str(src), "--out", str(out)]) == 0
    h200, h100 = Profile.load(src), Profile.load(out)
    assert h100.gpu == "h100-sxm"
    assert h100.copy_bandwidth_bytes_per_s == pytest.approx(h200.copy_bandwidth_bytes_per_s * 3.35 / 4.8)
    assert h100.optimizer_s_per_param == pytest.approx(h200.optimizer_s_per_param * 4.8 / 3.35)
    assert len(h100.wgrad_points) == len(h200.wgrad_points) > 0
    for (m, n, k, t0), (_, _, _, t1) in zip(h200.gemm_points + h200.wgrad_points, h100.gemm_points + h100.wgrad_points):
        assert t0 <= t1 <= t0 * 4.8 / 3.35 * (1 + 1e-9)
    assert all(p["status"] == "derived" for p in h100.provenance["parts"])
    assert not any(c.measured for c in h100.collectives)
    # a corrupted source gets one sentence naming it
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert derive.main([str(bad), "--out", str(tmp_path / "y.json")]) == 1
    assert "bad.json" in capsys.readouterr().err


def test_model_gemms_are_timed_first(tmp_path):
    """`plan profile --model CONFIG`: every GEMM of that model's plans is in the profile's tables, measured (not
    interpolated), including token counts between the grid's lines (micro-batch 5: 5 x sequence)."""
    from runtime.profiler import shapes
    from planner.model import resolve_model
    cfg = tmp_path / "tiny-gpt2" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_embd": 48, "n_layer": 2, "n_head": 4, "n_positions": 16,
                               "vocab_size": 96}))
    out = tmp_path / "p.json"
    assert cli.main(["--device", "cpu", "--quick", "--gpus", "1", "--model", str(cfg), "--out", str(out),
                     "--no-progress"]) == 0
    d = json.loads(out.read_text())
    grid = d["extras"]["gemm_grid"]
    assert grid["exact_models"] == ["tiny-gpt2"] and grid["exact_shapes"] > 0
    spec = resolve_model(str(cfg))
    want = shapes.model_gemm_shapes(spec, spec.default_seq_len, grid["tp"], flops_cap=grid["flops_cap"])
    assert len(want) == grid["exact_shapes"]
    measured = {(m, n, k) for m, n, k, _ in d["gemm"]["points"]}
    wgrad = {(m, n, k) for m, n, k, _ in d["gemm"]["wgrad_points"]}
    for g in want:
        assert (g.m, g.n, g.k) in (wgrad if g.kind == "wgrad" else measured), g
    assert any(g.m == 5 * 16 and g.kind == "fwd" for g in want)   # micro-batch 5, between the grid's lines
    assert {p["head_dim"] for p in d["attention"]["points"]} >= {12}   # its head dimension, 48 / 4


def test_unknown_profile_model_is_one_sentence(tmp_path, capsys):
    assert cli.main(["--device", "cpu", "--gpus", "1", "--model", "gpt-7", "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert "unknown model 'gpt-7'" in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_burst_and_no_host_reach_the_options(tmp_path, monkeypatch):
    """`plan profile --burst --no-host` turn off the power-cap heater and the host stage; by default both are on."""
    from runtime.profiler import build

    seen = []

    def fake_build(opts, reporter=None):
        seen.append(opts)
        raise build.PlanError("stop here")

    monkeypatch.setattr(build, "build_profile", fake_build)
    for extra, cap, host in (([], True, True), (["--burst", "--no-host"], False, False)):
        assert cli.main(["--device", "cpu", "--quick", "--out", str(tmp_path / "p.json"), "--no-progress"] + extra) != 0
        assert (seen[-1].at_power_cap, seen[-1].host) == (cap, host)
    assert not (tmp_path / "p.json").exists()


def _tiny_gpt2_config(tmp_path):
    cfg = tmp_path / "tiny-gpt2" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_embd": 48, "n_layer": 2, "n_head": 4, "n_positions": 16,
                               "vocab_size": 96}))
    return cfg


def test_base_gets_the_models_gemms_and_keeps_the_rest(cpu_profile, tmp_path, capsys):
    """`plan profile --model CONFIG --base PROFILE`: every GEMM of the model's plans becomes a measured point; the
    base's own points, collectives, attention, calibration and host figures are kept as they were; the provenance
    says what was added; a second run adds nothing; plans stop saying their GEMMs are interpolated."""
    from dataclasses import replace

    from planner.cluster import ClusterSpec
    from planner.model import resolve_model
    from planner.plan import TrainingShape
    from planner.search import Pins, search
    from runtime.profiler import shapes
    from runtime.profiler.extend import ADDED_KEY

    cfg = _tiny_gpt2_config(tmp_path)
    spec = resolve_model(str(cfg))
    # a calibrated base: the factors must survive the extension
    base = Profile.load(cpu_profile)
    base = replace(base, efficiency={"compute": 1.07, "tp": 1.2})
    base_path = tmp_path / "base.json"
    base.save(base_path)
    base = Profile.load(base_path)
    out = tmp_path / "ext.json"
    assert cli.main(["--device", "cpu", "--gpus", "1", "--model", str(cfg), "--base", str(base_path),
                     "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out
    ext = Profile.load(out)
    grid = base.extras["gemm_grid"]
    want = shapes.model_gemm_shapes(spec, spec.default_seq_len, grid["tp"], flops_cap=grid["flops_cap"])
    assert want and all(ext.gemm_measured(g.table, g.m, g.n, g.k) for g in want)
    assert not all(base.gemm_measured(g.table, g.m, g.n, g.k) for g in want)
    assert set(base.gemm_points) <= set(ext.gemm_points) and set(base.wgrad_points) <= set(ext.wgrad_points)
    for field in ("collectives", "efficiency", "overlap_hidden_fraction", "host",
                  "copy_bandwidth_bytes_per_s", "optimizer_s_per_param", "gpu"):
        assert getattr(ext, field) == getattr(base, field), field
    rec = ext.provenance[ADDED_KEY][-1]
    added = len(ext.gemm_points) + len(ext.wgrad_points) - len(base.gemm_points) - len(base.wgrad_points)
    assert rec["models"] == ["tiny-gpt2"] and sum(rec["added"].values()) == added > 0
    assert rec["shapes_wanted"] == len(want) and rec["already_measured"] == len(want) - added
    assert f"{added} GEMM shapes of tiny-gpt2 added" in said
    # its head dimension (48 / 4 = 12) is not on the CPU grid's (16, 32): its causal attention is timed and added
    assert not base.attention_measured(12, True) and ext.attention_measured(12, True)
    assert not ext.attention_measured(12, False) and "attention points at head dimension 12" in said
    assert ext.attention_points[:len(base.attention_points)] == base.attention_points
    # again on the extended profile: nothing left to time, nothing changes but the record
    again = tmp_path / "again.json"
    assert cli.main(["--device", "cpu", "--gpus", "1", "--model", str(cfg), "--base", str(out),
                     "--out", str(again), "--no-progress"]) == 0
    twice = Profile.load(again)
    assert twice.gemm_points == ext.gemm_points and twice.provenance[ADDED_KEY][-1]["already_measured"] == len(want)

    def gemm_note(prof):
        plan = search(spec, TrainingShape(16, 5), ClusterSpec(gpu="cpu", num_gpus=1, gpus_per_node=1), prof,
                      Pins(micro_batch=5), top_k=1).plans[0]
        return [m for m in plan.provenance["modelled"] if m.startswith(("GEMMs:", "attention: head dimension 12"))]

    note = gemm_note(base)
    assert len(note) == 2 and all(f"--base {base_path}" in n for n in note)  # the GEMMs and the attention
    assert not gemm_note(ext)


def test_base_of_another_gpu_or_without_model_is_one_sentence(tmp_path, capsys):
    from planner.profile import shipped_profile_path

    cfg = _tiny_gpt2_config(tmp_path)
    out = tmp_path / "x.json"
    assert cli.main(["--device", "cpu", "--gpus", "1", "--model", str(cfg), "--base", "h200-sxm",
                     "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "measured on h200-sxm and this device is cpu" in err and "Traceback" not in err
    assert not out.exists()
    assert cli.main(["--device", "cpu", "--gpus", "1", "--base", str(shipped_profile_path("h200-sxm")),
                     "--out", str(out)]) == 1
    assert "name the model with --model" in capsys.readouterr().err and not out.exists()
