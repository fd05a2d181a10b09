"""The GEMM grid split across processes (runtime/profiler/gemm_workers.py) on CPU: same points, same order and
the same contract as the one-device kernels.time_gemms, and a failing worker is one PlanError."""
import time

import pytest

from planner.errors import PlanError
from runtime.profiler import kernels
from runtime.profiler.gemm_workers import time_gemms_parallel
from runtime.profiler.shapes import GemmShape

SHAPES = [GemmShape(m, n, k, kind) for m, n, k in ((8, 16, 8), (16, 32, 8), (32, 16, 16), (8, 8, 32))
          for kind in ("fwd", "dgrad", "wgrad")]
REPS = dict(warmup=0, repeats=1)


def _keys(points):
    return [(m, n, k, kind) for m, n, k, _, kind in points]


def test_two_processes_time_every_shape_in_grid_order():
    steps = []
    seq_points, seq_spreads, seq_skipped = kernels.time_gemms(SHAPES, "cpu", **REPS)
    points, spreads, skipped = time_gemms_parallel(SHAPES, ["cpu", "cpu"], deadline=time.monotonic() + 60,
                                                   progress=steps.append, **REPS)
    assert _keys(points) == _keys(seq_points) == [(s.m, s.n, s.k, s.kind) for s in SHAPES]
    assert skipped == seq_skipped == 0
    assert len(spreads) == len(seq_spreads) == len(points)
    assert all(t > 0 for *_, t, _ in points)
    assert sum(steps) == len(SHAPES)


def test_passed_deadline_skips_every_shape_as_time_gemms_does():
    past = time.monotonic() - 1
    seq = kernels.time_gemms(SHAPES, "cpu", deadline=past, **REPS)
    par = time_gemms_parallel(SHAPES, ["cpu", "cpu"], deadline=past, **REPS)
    assert seq == par == ([], [], len(SHAPES))


def test_one_device_times_in_process():
    points, _, skipped = time_gemms_parallel(SHAPES[:3], ["cpu"], deadline=None, **REPS)
    assert _keys(points) == [(s.m, s.n, s.k, s.kind) for s in SHAPES[:3]] and skipped == 0


def test_failing_worker_is_one_plan_error():
    with pytest.raises(PlanError, match=r"cuda:99") as info:
        time_gemms_parallel(SHAPES, ["cpu", "cuda:99"], deadline=time.monotonic() + 60, **REPS)
    assert "\n" not in str(info.value)
