"""`plan profile` refuses, in one sentence and before measuring, a --gpu-kind other than the device it measures
and an output it could not write; a missing output folder is made."""
from __future__ import annotations

import pytest

from planner.errors import PlanError
from runtime.profiler import build, cli


@pytest.fixture
def no_measuring(monkeypatch):
    """build_profile fails the test if reached: the refusals must come before any measuring."""
    def fail(*a, **k):
        raise AssertionError("measured before refusing")

    monkeypatch.setattr(build, "build_profile", fail)


def test_cpu_profile_cannot_be_labelled_a_gpu(tmp_path, capsys, no_measuring):
    out = tmp_path / "p.json"
    assert cli.main(["--device", "cpu", "--gpu-kind", "h200-sxm", "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--gpu-kind h200-sxm does not match the device measured" in err and "'cpu'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("asked,measured,ok", [
    (None, "cpu", "cpu"), ("cpu", "cpu", "cpu"), ("h200-sxm", "h200-sxm", "h200-sxm"),
    ("h200-sxm", "cpu", None), ("h100-sxm", "h200-sxm", None),
    ("h100-sxm", "h100-pcie", None),          # a PCIe card is not an SXM one, though the planner lacks its kind
    ("l40s-lab", "l40s", "l40s-lab"),         # a device the planner does not know: --gpu-kind only names it
])
def test_recorded_gpu_kind(asked, measured, ok):
    if ok is None:
        with pytest.raises(PlanError, match="does not match the device measured"):
            build.recorded_gpu_kind(asked, measured, "the device")
    else:
        assert build.recorded_gpu_kind(asked, measured, "the device") == ok


@pytest.mark.parametrize("where,says", [("/proc/x.json", "cannot be written"), ("{tmp}", "is a folder"),
                                        ("{tmp}/file.txt/x.json", "is not a folder")])
def test_unwritable_output_refused_before_measuring(tmp_path, capsys, no_measuring, where, says):
    (tmp_path / "file.txt").write_text("a file where a folder should be")
    out = where.format(tmp=tmp_path)
    assert cli.main(["--device", "cpu", "--gpus", "1", "--out", out, "--no-progress", "--force"]) == 1
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_output_folder_is_refused(tmp_path, monkeypatch, capsys):
    """No folder is made silently: --out in a folder that does not exist is refused before any measuring."""
    from planner.profile import load_profile

    monkeypatch.setattr(build, "build_profile", lambda opts, reporter=None: load_profile("h200-sxm", "h200-sxm"))
    out = tmp_path / "new" / "deeper" / "p.json"
    assert cli.main(["--device", "cpu", "--gpus", "1", "--out", str(out), "--no-progress"]) == 1
    assert "does not exist (create it first)" in capsys.readouterr().err and not (tmp_path / "new").exists()
