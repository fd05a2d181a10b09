"""Hostile files over the subcommands that read them: deep nesting, integers beyond float range, FIFOs, devices,
folders, dangling and planted symbolic links, forged calibration rows. Each ends in one sentence and exit code 1,
within seconds, with nothing outside the outputs changed (planner/json_input.py, planner/outputs.py,
planner/calibrate.py)."""
from __future__ import annotations

import os
import stat

import pytest

from planner.calibrate import RESULT_COLUMNS
from planner.json_input import MAX_DEPTH, MAX_INT_DIGITS
from planner.limits import is_number, is_whole
from tests.planner.test_bad_input import run_main, tiny_plan


def _one_sentence(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("plan: "), err
    return lines[0]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_plan().save(tmp_path / "plan.json")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    (tmp_path / "deep70.json").write_text('{"a": ' + "[" * 70 + "]" * 70 + "}")
    (tmp_path / "bigint.json").write_text('{"num_gpus": ' + "9" * 400 + "}")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "folder.json").mkdir()
    return tmp_path


@pytest.mark.parametrize("argv,needle", [
    (["export", "deep.json", "--to", "slurm"], f"plan file 'deep.json' is refused: it nests more than {MAX_DEPTH}"),
    (["export", "deep70.json", "--to", "slurm"], f"it nests more than {MAX_DEPTH} levels deep"),
    (["export", "bigint.json", "--to", "slurm"], f"holds an integer of 400 digits, more than the {MAX_INT_DIGITS}"),
    (["export", "fifo.json", "--to", "slurm"], "plan file 'fifo.json' is not a regular file (it is a FIFO)"),
    (["export", "/dev/zero", "--to", "slurm"], "plan file '/dev/zero' is not a regular file (it is a device)"),
    (["export", "folder.json", "--to", "slurm"], "plan file 'folder.json' is a folder, not a file"),
    (["--model", "fifo.json", "--gpus", "8"], "model config 'fifo.json' is not a regular file"),
    (["--model", "deep.json", "--gpus", "8"], "is refused: it nests more than"),
    (["--model", "gpt-1.3b", "--cluster", "fifo.json"], "cluster file 'fifo.json' is not a regular file"),
    (["--model", "gpt-1.3b", "--cluster", "bigint.json"], "holds an integer of 400 digits"),
    (["--model", "gpt-1.3b", "--gpus", "8", "--profile", "fifo.json"], "is not a regular file (it is a FIFO)"),
    (["--model", "gpt-1.3b", "--gpus", "8", "--profile", "deep.json"], "nests more than"),
    (["launch", "plan.json", "--device", "cpu", "--data", "fifo.json", "--dry-run"],
     "data source 'fifo.json' is not a regular file"),
    (["launch", "plan.json", "--device", "cpu", "--data", "/dev/zero", "--dry-run"], "is not a regular file"),
    (["launch", "plan.json", "--device", "cpu", "--results", "/dev/full", "--dry-run"],
     "results file '/dev/full' is not a regular file"),
    (["launch", "fifo.json", "--device", "cpu", "--dry-run"], "is not a regular file (it is a FIFO)"),
    (["calibrate", "fifo.json", "--profile", "h200-sxm", "-o", "c.json"], "results file 'fifo.json' is not a regular"),
    (["calibrate", "/dev/zero", "--profile", "h200-sxm", "-o", "c.json"], "is not a regular file (it is a device)"),
])
def test_hostile_file_is_one_sentence(files, capsys, argv, needle):
    rc, out, err = run_main(argv, capsys)
    assert rc == 1, (out, err)
    assert needle in _one_sentence(err)


def test_integers_beyond_float_range_are_numbers_for_the_range_checks():
    assert is_number(10 ** 400) and is_whole(10 ** 400) and not is_number(float("nan")) and not is_whole(True)


@pytest.mark.parametrize("value,needle", [
    ("1e300", "has measured_step_s 1e300, outside the physical range 0 to 1e+07 seconds"),
    ("-3", "has measured_step_s -3, outside the physical range"),
    ("inf", "has measured_step_s inf, outside the physical range"),
    ("abc", "has measured_step_s 'abc', not a number"),
])
def test_calibrate_refuses_unphysical_rows_naming_them(files, capsys, value, needle):
    row = dict.fromkeys(RESULT_COLUMNS, "1")
    row.update(measured_step_s="2.0", measured_mem_gib="")
    bad = dict(row, measured_step_s=value)
    (files / "r.csv").write_text("\n".join([",".join(RESULT_COLUMNS), ",".join(row.values()),
                                            ",".join(bad.values())]) + "\n")
    rc, _, err = run_main(["calibrate", "r.csv", "--profile", "h200-sxm", "-o", "c.json"], capsys)
    assert rc == 1 and _one_sentence(err).startswith(f"plan: row 2 of 'r.csv' {needle}")
    assert not (files / "c.json").exists()


def test_outputs_never_write_through_a_symlink(files, capsys):
    """A dangling link as -o: refused (nothing made where it points); a link to a file with --force: the link
    itself is replaced by a new file, and the target keeps its content and mode."""
    (files / "dangling.json").symlink_to(files / "nowhere" / "x.json")
    rc, _, err = run_main(["--model", "gpt-1.3b", "--gpus", "8", "-o", "dangling.json"], capsys)
    assert rc == 1 and "is a symbolic link; pass --force to replace the link itself" in _one_sentence(err)
    assert not (files / "nowhere").exists()
    target = files / "target.txt"
    target.write_text("mine\n")
    target.chmod(0o600)
    (files / "link.sh").symlink_to(target)
    rc, _, err = run_main(["export", "plan.json", "--to", "slurm", "-o", "link.sh"], capsys)
    assert rc == 1 and "is a symbolic link" in _one_sentence(err)
    rc, _, err = run_main(["export", "plan.json", "--to", "slurm", "-o", "link.sh", "--force"], capsys)
    assert rc == 0, err
    assert target.read_text() == "mine\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not (files / "link.sh").is_symlink() and (files / "link.sh").read_text().startswith("#!")


def test_export_force_keeps_an_existing_file_s_mode(files, capsys):
    existing = files / "job.sh"
    existing.write_text("old\n")
    existing.chmod(0o640)
    rc, _, err = run_main(["export", "plan.json", "--to", "slurm", "-o", "job.sh", "--force"], capsys)
    assert rc == 0, err
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640 and existing.read_text().startswith("#!")
