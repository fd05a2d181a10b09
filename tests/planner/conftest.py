"""Shared fixtures of the planner tests: the shipped profile, small models and a CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.profile import load_profile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def profile():
    return load_profile("h200-sxm", "h200-sxm")


def run_cli(*args, cwd=None, timeout=120):
    """`python -m planner.cli ARGS` as a subprocess; (returncode, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    p = subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd or REPO, env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def assert_one_sentence_error(rc, out, err, code=1):
    assert rc == code, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("plan: ")
    return lines[0]
