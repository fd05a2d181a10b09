"""plan validate's traced-step block: which predicted keys each measured component holds, which rank is compared,
the fractions, and reading the record the workers write."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from runtime.trace_analysis import RankComponents
from runtime.validate import COMPONENTS, TracedStep, components_report, predicted_components_s, read_components

# every key of planner/cost/'s breakdown_s, each value distinct so that a wrong mapping shows
BREAKDOWN_S = {"compute": 0.50, "host": 0.02, "recompute": 0.10, "tp_comm": 0.03, "cp_comm": 0.005,
               "ep_comm": 0.007, "pp_comm": 0.011, "bubble": 0.08, "dp_comm": 0.013, "optimizer": 0.04}
COMPONENT_OF_KEY = {"compute": "GPU compute", "recompute": "GPU compute", "optimizer": "GPU compute",
                    "tp_comm": "exposed communication", "cp_comm": "exposed communication",
                    "ep_comm": "exposed communication", "dp_comm": "exposed communication",
                    "pp_comm": "exposed communication", "bubble": "GPU idle", "host": "GPU idle"}


def _rank(rank, span, busy, compute, communication, exposed):
    return RankComponents(rank=rank, span_s=span, busy_s=busy, compute_s=compute, communication_s=communication,
                          exposed_communication_s=exposed)


RANKS = [_rank(0, 0.80, 0.70, 0.66, 0.06, 0.04),
         _rank(1, 0.90, 0.72, 0.63, 0.12, 0.09),    # the largest span: compared
         _rank(2, 0.85, 0.80, 0.75, 0.10, 0.05)]    # the busiest, but a shorter span


def _prediction(breakdown=BREAKDOWN_S):
    return SimpleNamespace(step_s=sum(breakdown.values()), memory_gib_per_rank=[1.0], breakdown_s=dict(breakdown))


def _row(lines: list[str], label: str) -> list[str]:
    (line,) = [ln for ln in lines if ln.startswith(f"  {label}  ")]
    return line[len(label) + 2:].split()


@pytest.mark.parametrize("key", sorted(BREAKDOWN_S))
def test_every_predicted_key_lands_in_its_component(key):
    got = predicted_components_s({key: 1.0})
    assert got == {c.label: (1.0 if c.label == COMPONENT_OF_KEY[key] else 0.0) for c in COMPONENTS}


def test_components_sum_the_breakdown():
    got = predicted_components_s(BREAKDOWN_S)
    assert got["GPU compute"] == pytest.approx(0.50 + 0.10 + 0.04)
    assert got["exposed communication"] == pytest.approx(0.03 + 0.005 + 0.007 + 0.011 + 0.013)
    assert got["GPU idle"] == pytest.approx(0.08 + 0.02)
    assert sum(got.values()) == pytest.approx(sum(BREAKDOWN_S.values()))


def test_report_compares_the_rank_with_the_largest_span():
    pred = _prediction()
    lines = components_report(pred, TracedStep(11, RANKS), steady_step_s=0.88)
    text = "\n".join(lines)
    assert "traced step 11: span 0.9 s on rank 1 (the largest of 3 rank(s)); steady median step 0.88 s (+2.3%" in text
    # predicted, measured, error, predicted / step, measured / span
    assert _row(lines, "GPU compute") == ["0.64", "0.63", "+1.6%", f"{0.64 / pred.step_s:.1%}", "70.0%"]
    assert _row(lines, "exposed communication") == ["0.066", "0.09", "-26.7%", f"{0.066 / pred.step_s:.1%}", "10.0%"]
    assert _row(lines, "GPU idle") == ["0.1", "0.18", "-44.4%", f"{0.1 / pred.step_s:.1%}", "20.0%"]
    assert "exposed communication per rank (s): 0: 0.04, 1: 0.09, 2: 0.05" in text
    assert "GPU idle: predicted bubble + host; measured span - busy" in text
    assert "exposed communication: predicted tp_comm + cp_comm + ep_comm + dp_comm + pp_comm;" in text
    assert "in no component" not in text


def test_equal_spans_compare_the_busier_rank():
    ranks = [_rank(0, 1.0, 0.5, 0.5, 0.0, 0.0), _rank(1, 1.0, 0.9, 0.8, 0.2, 0.1)]
    assert TracedStep(3, ranks).compared_rank().rank == 1
    assert TracedStep(3, list(reversed(ranks))).compared_rank().rank == 1


def test_a_key_outside_the_components_is_named():
    lines = components_report(_prediction({**BREAKDOWN_S, "new_thing": 0.25}), TracedStep(2, RANKS), 0.9)
    assert "    predicted but in no component: new_thing 0.25" in lines


def test_not_traced_is_one_line_and_not_asked_is_none():
    pred = _prediction()
    assert components_report(pred, None, 1.0) == []
    (line,) = components_report(pred, "not traced on CPU (no GPU kernels to time)", 1.0)
    assert line.endswith(": not traced on CPU (no GPU kernels to time)")
    (line,) = components_report(pred, TracedStep(2, [_rank(0, 0.0, 0.0, 0.0, 0.0, 0.0)]), 1.0)
    assert line.endswith("the trace holds no GPU kernels")


def test_full_report_carries_the_block(tmp_path):
    from planner.model import tiny_model
    from planner.plan import Layout, Plan, TrainingShape, even_stages
    from runtime.validate import report

    spec = tiny_model("llama")
    plan = Plan(model=spec, cluster={"num_gpus": 1}, training=TrainingShape(32, 8), layout=Layout(micro_batch=2),
                stages=even_stages(spec.num_layers, 1, "selective"))
    meas = {"steps": 4, "step_s_min": 0.8, "step_s_max": 0.95, "step_s": 0.88, "mem_gib": None, "mem_by_rank": "",
            "optimizer_s": 0.05, "bubble_frac": None, "components": TracedStep(11, RANKS)}
    text = report(plan, _prediction(), meas)
    assert "(timed apart in the traced step below)" in text and "on rank 1" in text
    assert text.index("optimizer (clip + AdamW)") < text.index("components of one extra step")
    meas["components"] = "not traced on CPU (no GPU kernels to time)"
    text = report(plan, _prediction(), meas)
    assert "(not timed apart by the runtime)" in text and text.rstrip().endswith("no GPU kernels to time)")


def test_read_components_from_the_workers_record(tmp_path):
    path = tmp_path / "c.json"
    assert read_components(path) == "the run wrote no traced step"
    path.write_text(json.dumps({"traced": False, "reason": "not traced on CPU (no GPU kernels to time)"}))
    assert read_components(path) == "not traced on CPU (no GPU kernels to time)"
    path.write_text(json.dumps({"traced": True, "step": 7, "ranks": [r.to_dict() for r in RANKS]}))
    assert read_components(path) == TracedStep(7, RANKS)
    path.write_text(json.dumps({"traced": True, "step": 7, "ranks": [{"rank": 0}]}))
    assert "malformed" in read_components(path)
    path.write_text("{not json")
    assert "could not be read" in read_components(path)
