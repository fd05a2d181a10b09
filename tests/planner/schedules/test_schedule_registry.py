"""A toy pipeline schedule added through the registry alone (planner/schedules/): GPipe, every forward of a rank
then every backward. The planner prices it (its in-flight peaks, its play against a hand-computed span, a plan's
memory and step) and the runtime's pipeline executor trains under it on CPU, matching a 1F1B run of the same
model. The workers import this module, so the schedule is registered in them too."""
from __future__ import annotations

import math
import os
import sys

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.errors import PlanError
from planner.model import resolve_model, tiny_model
from planner.plan import Layout, Plan, StagePlan, TrainingShape, even_stages
from planner.schedules import ONE_F_ONE_B, SCHEDULES, PipelineSchedule, register_schedule, schedule_named
from planner.schedules.base import BACKWARD, FORWARD


class GPipe(PipelineSchedule):
    """GPipe: all m forwards of the rank's one chunk, then all m backwards in micro-batch order."""

    name = "gpipe-toy"

    def violation(self, pp, v, m):
        return None if v == 1 else "the toy GPipe schedule runs one chunk per pipeline rank"

    def order(self, pp, v, m, rank):
        return [(FORWARD, 0, mb) for mb in range(m)] + [(BACKWARD, 0, mb) for mb in range(m)]


GPIPE = register_schedule(GPipe())


def test_registered_by_name():
    assert schedule_named("gpipe-toy") is GPIPE and "gpipe-toy" in SCHEDULES
    with pytest.raises(PlanError, match="unknown pipeline schedule 'nope'"):
        schedule_named("nope")


def test_in_flight_peaks_hold_every_micro_batch():
    """GPipe keeps all m micro-batches on every rank; 1F1B at most pp - rank."""
    assert [GPIPE.in_flight_peaks(4, 1, 8, r) for r in range(4)] == [((8,),)] * 4
    assert [ONE_F_ONE_B.in_flight_peaks(4, 1, 8, r) for r in range(4)] == [((4,),), ((3,),), ((2,),), ((1,),)]


def test_play_by_hand():
    """PP 2, 2 micro-batches, forward 1 s and backward 2 s per stage, hop 0.5 s. Rank 0: F0 [0, 1], F1 [1, 2].
    Rank 1: F0 [1.5, 2.5], F1 [2.5, 3.5], B0 [3.5, 5.5], B1 [5.5, 7.5]. Rank 0: B0 [6, 8] (after rank 1's B0 and a
    hop), B1 [8, 10]. Span 10 s."""
    assert GPIPE.play_s(2, 1, 2, [1.0, 1.0], [2.0, 2.0], 0.5) == pytest.approx(10.0)
    assert GPIPE.play_s(2, 1, 2, [1.0, 1.0], [2.0, 2.0], 0.0) == pytest.approx(9.0)


def test_plans_with_it(profile):
    """A layout naming the toy schedule is legal, priced by it (more activation memory than 1F1B: every micro-batch
    in flight), split by the greedy split and CP-SAT, and its plan file round-trips."""
    from planner.search.stages import greedy_stages, solve_stages

    model = resolve_model("gpt-1.3b")
    shape = TrainingShape(2048, 16)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=4, gpus_per_node=4)
    gpipe, ofob = Layout(pp=4, sharding="none", schedule="gpipe-toy"), Layout(pp=4, sharding="none")
    assert ofob.schedule == "1f1b"
    stages = even_stages(model.num_layers, 4)
    cg, c1 = (CostModel(model, shape, lay, cluster, profile) for lay in (gpipe, ofob))
    assert cg.schedule is GPIPE and cg.in_flight_peaks(3, cg.num_micro) == ((16,),)
    pg, p1 = cg.predict(stages), c1.predict(stages)
    assert all(a > b for a, b in zip(pg.memory_gib_per_rank, p1.memory_gib_per_rank))
    assert math.isfinite(pg.step_s) and pg.step_s > 0
    limit = 1e15
    greedy = greedy_stages(cg, shape, limit)
    assert greedy is not None and sum(s.layers for s in greedy) == model.num_layers
    res = solve_stages(cg, shape, limit, hint=greedy, work_limit=0.05)
    assert res.stages is not None
    plan = Plan(model=model, cluster=cluster.to_dict(), training=shape, layout=gpipe, stages=stages, prediction=pg)
    again = Plan.from_dict(plan.to_dict())
    assert again.layout.schedule == "gpipe-toy"


def test_unknown_schedule_in_a_plan_file_is_one_sentence():
    model = tiny_model("gpt")
    plan = Plan(model=model, cluster=ClusterSpec(gpu="cpu", num_gpus=2, gpus_per_node=2).to_dict(),
                training=TrainingShape(32, 8), layout=Layout(pp=2, sharding="none"), stages=even_stages(4, 2))
    d = plan.to_dict()
    d["layout"]["schedule"] = "zigzag"
    with pytest.raises(PlanError, match="layout.schedule 'zigzag' is not a known pipeline schedule"):
        Plan.from_dict(d)
    del d["layout"]["schedule"]  # plan files without the key: derived from vpp
    assert Plan.from_dict(d).layout.schedule == "1f1b"


# -- the runtime: the executor plays the toy schedule's order -------------------------------------------------------

def _worker(rank, world):
    tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parallel = os.path.join(tests, "runtime", "parallel")
    if parallel not in sys.path:
        sys.path.insert(0, parallel)
    import _pp_common as C

    spec = tiny_model("llama", num_layers=6)
    plans = [StagePlan(2), StagePlan(4, 0, 2)]
    base = dict(pp=2, micro_batch=2, sharding="none")
    ref = C.pipelined(spec, Layout(**base), plans)[:2]
    got = C.pipelined(spec, Layout(**base, schedule="gpipe-toy"), plans)[:2]
    C.compare(ref, got, f"rank {rank} gpipe against 1f1b")


def test_runtime_trains_under_the_toy_schedule():
    from runtime.parallel.pipeline import simulate

    ticks, _ = simulate(2, 1, 4, GPIPE)
    assert [a.kind for _, a in ticks[1]] == ["F"] * 4 + ["B"] * 4
    tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parallel = os.path.join(tests, "runtime", "parallel")
    if parallel not in sys.path:
        sys.path.insert(0, parallel)
    import _launch

    _launch.run(_worker, 2)


def test_runtime_refuses_dual_pipe():
    from runtime.parallel.pipeline import layout_schedule

    with pytest.raises(ValueError, match="does not run the DualPipe schedule"):
        layout_schedule(Layout(pp=2, schedule="dualpipe"))
