"""Pre-flight of `plan launch`: the checkpoint folder and the step CSV are checked before torchrun starts, so
a run never trains to fail at its first save or append to a file that is not its own."""
import os

import pytest

from runtime.launch import main
from tests.runtime.test_launch import _one_sentence, write_plan


@pytest.fixture
def base(tmp_path):
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    return [plan, "--device", "cpu", "--nproc-per-node", "1", "--dry-run"]


def test_checkpoint_folder_must_be_makeable(tmp_path, base, capsys):
    (tmp_path / "afile").write_text("")
    assert main(base + ["--ckpt-dir", str(tmp_path / "afile" / "ck"), "--results", str(tmp_path / "r.csv")]) == 1
    assert _one_sentence(capsys) == (f"plan: --ckpt-dir '{tmp_path}/afile/ck' cannot be made: '{tmp_path}/afile' "
                                     "is a file, not a folder")
    assert main(base + ["--ckpt-dir", str(tmp_path / "new" / "ck"), "--results", str(tmp_path / "r.csv")]) == 0
    assert not (tmp_path / "new").exists()  # checked, not made: the first save makes it


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder")
def test_unwritable_checkpoint_folder_is_refused(tmp_path, base, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(base + ["--ckpt-dir", str(ro), "--results", str(tmp_path / "r.csv")]) == 1
        assert _one_sentence(capsys) == f"plan: --ckpt-dir '{ro}' is not writable"
        assert main(base + ["--ckpt-dir", str(ro / "ck"), "--results", str(tmp_path / "r.csv")]) == 1
        assert _one_sentence(capsys) == f"plan: --ckpt-dir '{ro}/ck' cannot be made: '{ro}' is not writable"
    finally:
        ro.chmod(0o700)


def test_resume_appends_only_to_a_step_csv(tmp_path, base, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    ck = str(tmp_path / "ck")
    assert main(base + ["--resume", "--ckpt-dir", ck, "--results", str(notes)]) == 1
    assert _one_sentence(capsys) == (f"plan: results file '{notes}' is not a step CSV of plan launch (its first "
                                     "line is not our header); give another --results")
    assert notes.read_text() == "my notes\n"
    ours = tmp_path / "r.csv"
    ours.write_text("step,loss,grad_norm\n1,5.5,1.0")
    assert main(base + ["--resume", "--ckpt-dir", ck, "--results", str(ours)]) == 1
    assert "no complete checkpoint" in _one_sentence(capsys)  # the CSV passed; the empty folder did not


def test_a_row_is_never_glued_onto_an_unterminated_line(tmp_path):
    from runtime.train import _end_with_newline
    f = tmp_path / "r.csv"
    f.write_text("step,loss\n1,5.5")
    _end_with_newline(f)
    _end_with_newline(f)
    assert f.read_text() == "step,loss\n1,5.5\n"
