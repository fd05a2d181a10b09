"""scoring._score leaves unsplit the layouts whose score bound exceeds the k-th best score: the same plans, runners-up
and alternatives as splitting every layout the time bounds let through, with fewer greedy splits."""
from __future__ import annotations

import pytest

from planner.cluster import ClusterSpec
from planner.model import resolve_model
from planner.plan import TrainingShape
from planner.search import Pins, scoring, search


def _shown(result):
    plans = [(p.layout, p.stages, p.prediction.step_s, p.prediction.memory_gib_per_rank) for p in result.plans]
    alternatives = [(a.label, a.plan.layout if a.plan else None, a.why) for a in result.alternatives]
    return plans, alternatives


@pytest.mark.parametrize("name,gpus,recompute", [("llama3-70b", 16, None), ("gpt-13b", 64, None),
                                                  ("llama3-70b", 16, "full")])
def test_score_bound_changes_no_plan(profile, monkeypatch, name, gpus, recompute):
    model = resolve_model(name)
    shape = TrainingShape(model.default_seq_len, model.default_global_batch)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=gpus, gpus_per_node=8)
    pins = Pins(recompute=recompute)
    pruned = search(model, shape, cluster, profile, pins, top_k=4, alternatives=True)
    monkeypatch.setattr(scoring, "closed_form_bound_s", lambda *args: 0.0)  # no bound: every layout in line split
    every = search(model, shape, cluster, profile, pins, top_k=4, alternatives=True)
    assert _shown(pruned) == _shown(every)
    assert pruned.stats.layouts_bounded == every.stats.layouts_bounded
    assert pruned.stats.unevaluated_below_best == every.stats.unevaluated_below_best
    assert pruned.stats.layouts_greedy < every.stats.layouts_greedy
