"""Why not another layout: the kinds compared, the words for where one loses, and the search's alternatives."""
from __future__ import annotations

import json

from planner.cluster import ClusterSpec
from planner.model import resolve_model
from planner.plan import Layout, Prediction, TrainingShape
from planner.search import search
from planner.search.alternatives import alternative_kinds, why_it_loses
from tests.planner.conftest import run_cli


def _lay(**k):
    base = dict(tp=1, pp=1, vpp=1, dp=1, cp=1, ep=1, micro_batch=1, sharding="optimizer")
    base.update(k)
    return Layout(**base)


def test_kinds_are_what_the_best_layout_is_not():
    best = _lay(tp=2, pp=4, vpp=2, dp=8)
    layouts = [best, _lay(tp=1, pp=8, dp=8), _lay(tp=8, dp=8), _lay(tp=2, pp=4, dp=8, sharding="full"),
               _lay(tp=2, pp=2, dp=8, cp=2)]
    kinds = dict(alternative_kinds(best, layouts, resolve_model("gpt-70b")))
    assert list(kinds) == ["TP 1", "TP 8", "no pipeline (PP 1)", "pipeline without virtual stages", "sharding full",
                           "context parallelism (CP > 1)"]
    assert kinds["TP 8"](_lay(tp=8)) and not kinds["TP 8"](best)
    assert kinds["pipeline without virtual stages"](_lay(pp=8)) and not kinds["pipeline without virtual stages"](_lay())
    # a kind none of the layouts is (no other TP here) is left out; MoE models compare expert-parallel degrees
    moe = dict(alternative_kinds(_lay(ep=8, dp=8), [_lay(ep=8, dp=8), _lay(ep=2, dp=8)], resolve_model("mixtral-8x7b")))
    assert "EP 2" in moe and not any(k.startswith("TP") for k in moe)
    assert "a pipeline (PP > 1)" not in moe


def _pred(step, **terms):
    return Prediction(step_s=step, tokens_per_s=1.0, tflops_per_gpu=1.0, mfu=0.5, memory_gib_per_rank=[1.0],
                      memory_limit_gib=2.0, breakdown_s=terms)


def test_why_it_loses_names_the_terms_that_grow_most():
    best = _pred(10.0, compute=9.0, tp_comm=0.5, bubble=0.5)
    alt = _pred(12.0, compute=8.0, tp_comm=3.0, bubble=0.6, dp_comm=0.4)
    assert why_it_loses(best, alt) == "+2.5 s exposed TP comm, +0.4 s exposed DP comm; -1 s compute"
    # nothing shrinks: no saving named
    alt = _pred(12.0, compute=9.0, tp_comm=2.0, bubble=1.0)
    assert why_it_loses(best, alt) == "+1.5 s exposed TP comm, +0.5 s pipeline bubble"
    # a term that grows by less than half a percent of the step is not named
    assert why_it_loses(best, _pred(10.03, compute=9.0, tp_comm=0.5, bubble=0.53)) == "about the same in every term"


def test_search_alternatives_are_of_their_kind_and_never_faster_than_the_first_plan(profile):
    model = resolve_model("llama3-8b")
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=16, gpus_per_node=8)
    res = search(model, TrainingShape(8192, 64), cluster, profile, alternatives=True)
    best = res.plans[0]
    kinds = dict(alternative_kinds(best.layout, [best.layout] + [a.plan.layout for a in res.alternatives if a.plan],
                                   model))
    assert len(res.alternatives) >= 4
    for alt in res.alternatives:
        assert alt.label in kinds
        assert not kinds[alt.label](best.layout)
        if alt.plan is not None:
            assert kinds[alt.label](alt.plan.layout)
            # an alternative that played faster would have become the first plan
            assert alt.plan.prediction.step_s >= best.prediction.step_s
            assert alt.why
    assert search(model, TrainingShape(8192, 64), cluster, profile).alternatives == []


def test_cli_shows_alternatives_when_asked():
    rc, out, err = run_cli("--model", "gpt-1.3b", "--gpus", "8", "--json", "--why-not")
    assert rc == 0, err
    alts = json.loads(out)["alternatives"]
    assert alts and all({"instead", "plan", "vs_best", "why"} <= set(a) for a in alts)
    assert all(a["vs_best"] >= 0 for a in alts if a["plan"])
    rc, out, err = run_cli("--model", "gpt-1.3b", "--gpus", "8", "--why-not")
    assert rc == 0 and "Why not another kind of layout" in out
    rc, out, err = run_cli("--model", "gpt-1.3b", "--gpus", "8", "--json")
    assert rc == 0 and json.loads(out)["alternatives"] == []


def test_cli_says_when_no_other_kind_of_layout_exists():
    rc, out, err = run_cli("--model", "gpt-1.3b", "--gpus", "1", "--why-not")
    assert rc == 0, err
    assert "no other kind of layout" in out and "--why-not shows" not in out


def test_moe_alternatives_have_expert_parallel_rows(profile):
    """An MoE model's --why-not table has a row for each expert-parallel degree the plan does not use, each with
    a plan of that degree and the terms it loses time in."""
    model = resolve_model("benchmarks/models/qwen3-30b-a3b/config.json")
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=64, gpus_per_node=8)
    res = search(model, TrainingShape(4096, 512), cluster, profile, alternatives=True)
    best = res.plans[0]
    ep_rows = [a for a in res.alternatives if a.label.startswith("EP ")]
    assert {int(a.label.split()[1]) for a in ep_rows} == {1, 2, 4, 8, 16, 32, 64} - {best.layout.ep}
    for a in ep_rows:
        assert a.plan is not None and a.plan.layout.ep == int(a.label.split()[1])
        assert a.why.startswith("+") or a.why.startswith("predicted faster")
