"""Exposed communication from kernel intervals, against hand-computed timelines; the per-rank components of a
traced step, gathered to rank 0."""
import json

import pytest

from runtime.trace_analysis import RankComponents, exposed_communication
from tests.runtime.dist_util import run_workers

TIMELINE = [("gemm", 0.0, 10.0), ("ncclDevKernel_AllGather", 2.0, 4.0),      # fully hidden
            ("ncclDevKernel_ReduceScatter", 9.0, 13.0),                     # 1 hidden, 3 exposed
            ("elementwise", 12.0, 12.5),                                    # hides 0.5 more
            ("ncclKernel_AllReduce", 20.0, 21.0)]                           # exposed


def test_hidden_partly_and_fully():
    x = exposed_communication(TIMELINE)
    assert x["span"] == 21.0
    assert x["communication"] == 2.0 + 4.0 + 1.0
    assert x["compute"] == 10.5
    assert abs(x["exposed_communication"] - (2.5 + 1.0)) < 1e-12
    assert abs(x["busy"] - (13.0 + 1.0)) < 1e-12


def test_no_communication():
    x = exposed_communication([("gemm", 0.0, 1.0)])
    assert x["exposed_communication"] == 0.0 and x["communication"] == 0.0


def test_rank_components_add_up_to_the_span():
    c = RankComponents.from_kernels(3, TIMELINE)
    assert c.rank == 3 and c.span_s == 21.0 and c.compute_s == 10.5
    assert c.idle_s == pytest.approx(21.0 - 14.0)   # 13 to 20 with no kernel
    assert c.compute_s + c.exposed_communication_s + c.idle_s == pytest.approx(c.span_s)
    d = json.loads(json.dumps(c.to_dict()))         # plain JSON, derived idle_s included
    assert d["idle_s"] == pytest.approx(7.0) and RankComponents.from_dict(d) == c
    assert RankComponents.from_kernels(0, []).span_s == 0.0


def _gather_components(rank, world, path):
    """write_step_components as on CUDA, with the profiler replaced by a per-rank synthetic timeline."""
    import runtime.trainer.components as C

    shift = 0.5 * rank   # rank r's kernels end r/2 later: a different span per rank
    C._traced_components = lambda run_step: RankComponents.from_kernels(
        rank, [(n, a, b + shift if b == 21.0 else b) for n, a, b in TIMELINE])
    C.write_step_components(path, True, 5, lambda: None)
    return json.loads(open(path).read()) if rank == 0 else None


def test_every_ranks_components_reach_rank_0_as_json(tmp_path):
    out = run_workers(_gather_components, 2, str(tmp_path / "c.json"))
    assert out["traced"] is True and out["step"] == 5
    assert [d["rank"] for d in out["ranks"]] == [0, 1]
    assert [d["span_s"] for d in out["ranks"]] == [21.0, 21.5]
    assert [d["exposed_communication_s"] for d in out["ranks"]] == pytest.approx([3.5, 4.0])
