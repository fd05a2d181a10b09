"""A write error while the trainer logs a step (a full disk) is one sentence that names the step to resume from."""
from __future__ import annotations

import csv
import errno
import io

import pytest

from planner.errors import PlanError
from runtime.train import StepLog


class _FullDisk(io.StringIO):
    name = "results.csv"

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")


def _log(last_saved):
    log = object.__new__(StepLog)  # only the results file's part of the step log
    log.results = _FullDisk()
    log.writer = csv.DictWriter(log.results, fieldnames=["step", "loss"])
    log.last_saved = last_saved
    return log


def test_a_full_disk_names_the_checkpoint_to_resume_from():
    with pytest.raises(PlanError) as err:
        _log(40)._write_row({"step": 42, "loss": "1.0"})
    msg = str(err.value)
    assert "\n" not in msg
    assert "writing step 42's row to the results file 'results.csv' failed (No space left on device)" in msg
    assert msg.endswith("resume from step 40 with --resume")


def test_a_full_disk_before_any_checkpoint_says_so():
    with pytest.raises(PlanError, match="no checkpoint was saved yet$"):
        _log(None)._write_row({"step": 3, "loss": "1.0"})
