"""Every number of a profile is checked on load (one sentence naming the file and the field, never a NaN step
time or a traceback); a profile of another GPU than the plan's gets a warning; output paths are checked
before the work."""
from __future__ import annotations

import json
import warnings

import pytest

from planner.errors import PlanError
from planner.profile import Profile, check_output_file, gpu_kind_of_device, load_profile, shipped_profile_path
from tests.planner.conftest import REPO, assert_one_sentence_error, run_cli

NAN, INF = float("nan"), float("inf")


def _shipped() -> dict:
    return json.loads(shipped_profile_path("h200-sxm").read_text())


def _set_host(d, v):
    d["host"]["family_single_rank_layer_s"] = {"llama": v}


# (what the audit or a reader would break, how, the field the sentence must name)
BAD_FIELDS = [
    ("NaN collective bandwidth", lambda d: d["collectives"][0].update(bus_bandwidth_bytes_per_s=NAN),
     r"collectives\[0\]\.bus_bandwidth_bytes_per_s is nan"),
    ("NaN GEMM time", lambda d: d["gemm"]["points"][0].__setitem__(3, NAN), r"gemm\.points\[0\] seconds is nan"),
    ("zero wgrad time", lambda d: d["gemm"]["wgrad_points"][2].__setitem__(3, 0.0), r"gemm\.wgrad_points\[2\] seconds"),
    ("infinite GEMM size", lambda d: d["gemm"]["points"][1].__setitem__(0, INF), r"gemm\.points\[1\] m is inf"),
    ("fractional GEMM size", lambda d: d["gemm"]["points"][1].__setitem__(2, 1.5), r"gemm\.points\[1\] k is 1\.5"),
    ("head_dim 0", lambda d: d["attention"]["points"][0].update(head_dim=0), r"attention\.points\[0\]\.head_dim is 0"),
    ("NaN sequence", lambda d: d["attention"]["points"][3].update(seq=NAN), r"attention\.points\[3\]\.seq is nan"),
    ("negative attention rate", lambda d: d["attention"]["points"][0].update(bwd_tflops=-1.0),
     r"attention\.points\[0\]\.bwd_tflops is -1\.0"),
    ("group_size 0", lambda d: d["collectives"][1].update(group_size=0), r"collectives\[1\]\.group_size is 0"),
    ("NaN latency", lambda d: d["collectives"][1].update(latency_s=NAN), r"collectives\[1\]\.latency_s is nan"),
    ("zero-byte collective point", lambda d: d["collectives"][0]["points"][0].__setitem__(0, 0.0),
     r"collectives\[0\]\.points\[0\] bytes is 0\.0"),
    ("NaN copy bandwidth", lambda d: d.update(copy_bandwidth_bytes_per_s=NAN), r"copy_bandwidth_bytes_per_s is nan"),
    ("zero elementwise efficiency", lambda d: d.update(elementwise_efficiency=0.0), r"elementwise_efficiency is 0\.0"),
    ("NaN optimizer time", lambda d: d.update(optimizer_s_per_param=NAN), r"optimizer_s_per_param is nan"),
    ("infinite launch time", lambda d: d.update(kernel_launch_s=INF), r"kernel_launch_s is inf"),
    ("text where a number goes", lambda d: d.update(optimizer_s_per_param="fast"), r"optimizer_s_per_param is 'fast'"),
    ("NaN overlap fraction", lambda d: d["overlap_hidden_fraction"].update(tp=NAN),
     r"overlap_hidden_fraction\.tp is nan"),
    ("NaN efficiency", lambda d: d["efficiency"].update(compute=NAN), r"efficiency\.compute is nan"),
    ("NaN single-rank host time", lambda d: _set_host(d, NAN), r"host\.family_single_rank_layer_s\.llama is nan"),
    ("infinite kernel time", lambda d: d["extras"]["elementwise"]["kernels"]["residual_add"].update(seconds=INF),
     r"extras\.elementwise\.residual_add\.seconds is inf"),
]


@pytest.mark.parametrize("why,break_it,field", BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_bad_number_is_named_on_load(tmp_path, why, break_it, field):
    d = _shipped()
    break_it(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))   # json writes NaN / Infinity, and reads them back
    with pytest.raises(PlanError, match=rf"profile '.*bad\.json' is corrupted: {field}") as exc:
        Profile.load(path)
    assert "\n" not in str(exc.value)


def test_shipped_profiles_pass_the_checks():
    for path in sorted((REPO / "profiles").glob("*.json")):
        if json.loads(path.read_text()).get("format") == "parallel-plan/profile":
            assert Profile.load(path).gemm_points, path


@pytest.mark.parametrize("break_it", [lambda d: d["collectives"][0].update(bus_bandwidth_bytes_per_s=NAN),
                                      lambda d: d["attention"]["points"][0].update(head_dim=0),
                                      lambda d: d["collectives"][1].update(group_size=0),
                                      lambda d: d.update(copy_bandwidth_bytes_per_s=NAN)],
                         ids=["nan-busbw", "head_dim-0", "group_size-0", "nan-copy-bandwidth"])
def test_plan_with_a_bad_profile_is_one_sentence_not_a_nan_plan(tmp_path, break_it):
    """The audit's cases: before the checks these printed 'step time nan s' with exit 0, or a traceback."""
    d = _shipped()
    break_it(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    line = assert_one_sentence_error(*run_cli("--model", "gpt-1.3b", "--gpus", "8", "--profile", path))
    assert "bad.json" in line and "is corrupted" in line


def test_other_gpu_profile_is_refused_unless_allowed(tmp_path):
    """README: a profile of another GPU is bad input (exit 1); --allow-other-gpu-profile turns it into a warning."""
    with pytest.raises(PlanError, match="measured on h100-sxm, but the plan is for h200-sxm.*--allow-other-gpu-profile"):
        load_profile("h100-sxm", "h200-sxm")
    with pytest.warns(UserWarning, match="measured on h100-sxm, but the plan is for h200-sxm"):
        load_profile("h100-sxm", "h200-sxm", other_gpu_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_profile("h200-sxm", "h200-sxm")   # the same GPU: silent
        load_profile(None, "h200-sxm")
    line = assert_one_sentence_error(*run_cli("--model", "gpt-1.3b", "--gpus", "8", "--gpu", "h200-sxm",
                                              "--profile", "h100-sxm"))
    assert "profile 'h100-sxm' was measured on h100-sxm, but the plan is for h200-sxm" in line
    rc, out, err = run_cli("--model", "gpt-1.3b", "--gpus", "8", "--gpu", "h200-sxm", "--profile", "h100-sxm",
                           "--allow-other-gpu-profile")
    assert rc == 0, err
    assert "warning: profile 'h100-sxm' was measured on h100-sxm, but the plan is for h200-sxm" in err


def test_default_profile_of_another_gpu_is_refused(tmp_path, monkeypatch):
    """The default file is checked too: a shipped file's name is no guarantee of the GPU inside it."""
    import planner.profile.files as prof_mod

    d = _shipped()
    d["gpu"] = "h100-sxm"
    path = tmp_path / "h200-sxm.json"
    path.write_text(json.dumps(d))
    monkeypatch.setattr(prof_mod, "default_profile_path", lambda gpu: path)
    with pytest.raises(PlanError, match="measured on h100-sxm"):
        load_profile(None, "h200-sxm")


@pytest.mark.parametrize("name,kind", [("NVIDIA H200", "h200-sxm"), ("NVIDIA H200 NVL", "h200-nvl"),
                                       ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
                                       ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("cpu", "cpu"),
                                       ("h200-sxm", "h200-sxm"), ("", "unknown-gpu")])
def test_gpu_kind_of_device(name, kind):
    assert gpu_kind_of_device(name) == kind


def test_check_output_file(tmp_path):
    with pytest.raises(PlanError, match="is a folder"):
        check_output_file(tmp_path, "-o")
    existing = tmp_path / "e.json"
    existing.write_text("keep")
    with pytest.raises(PlanError, match="already exists; pass --force"):
        check_output_file(existing, "-o")
    check_output_file(existing, "-o", overwrite=True)
    check_output_file(existing, "--append", append=True)
    assert existing.read_text() == "keep"
    with pytest.raises(PlanError, match="cannot be written: .* is not a folder"):
        check_output_file(existing / "x.json", "-o")
    with pytest.raises(PlanError, match="cannot be written"):
        check_output_file("/proc/x.json", "-o")
    check_output_file(tmp_path / "new" / "deeper" / "x.json", "-o")   # a missing folder is made by the writer
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".write-check-*"))
