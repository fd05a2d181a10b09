"""CONTRIBUTING.md's three examples (a model family, a pipeline schedule, a collective) run as written, each
through its registry alone, in a fresh interpreter (registrations are process-wide)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECKS = [
    "from planner.model import family_of; assert family_of('gpt_rms').mlp == 'swiglu'",
    "from planner.schedules import schedule_named; assert schedule_named('gpipe').in_flight_peaks(2, 1, 4, 0) == ((4,),)",
    "from planner.collectives import collective_named; assert collective_named('broadcast').bus_factor(8) == 1.0",
]


def test_contributing_examples_register_and_are_read():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "CONTRIBUTING.md").read_text(), re.S)
    assert len(blocks) == len(CHECKS)
    for block, check in zip(blocks, CHECKS):
        p = subprocess.run([sys.executable, "-c", block + "\n" + check], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
        assert p.returncode == 0, p.stderr
