"""Why not another layout: the kinds of layout a recommended plan is compared against, each kind's best plan found
from the search's own candidates (`search(alternatives=True)`, `plan --why-not`), and where it loses time.

A user who would otherwise copy a configuration asks "why not TP 8?" or "why not ZeRO-3?". For each kind of
layout the recommended one is not, this module finds that kind's best plan and says in a few words where it
loses: the breakdown terms that grow the most.

Kinds: every other tensor-parallel degree; with and without a pipeline; interleaved or not (where the plan
pipelines); every other sharding level; with and without context parallelism; for MoE models every other
expert-parallel degree. A kind with no legal layout (or excluded by the user's pins) is left out.
"""
from __future__ import annotations

from typing import Callable

from planner import memory as mem
from planner.breakdown import BREAKDOWN_SHORT_LABEL as TERM_LABEL
from planner.model import ModelSpec
from planner.plan import Layout, Plan
from planner.search.result import Alternative, SearchStats
from planner.search.scoring import _Candidate, _plan_of, _score

Kind = tuple[str, Callable[[Layout], bool]]

SHOWN_TERMS = 2
"""How many of the terms that grow the most are named per alternative."""

SMALLEST_SHOWN_SHARE = 0.005
"""A term that grows by less than this share of the recommended step is not worth naming."""

ALTERNATIVE_SPLITS = 6
"""The alternatives' searches split at most this many of each kind's layouts, best bound first (a few tenths of a
second for all kinds together; their figures are that kind's best found, not proven best)."""


def alternative_kinds(best: Layout, layouts: list[Layout], model: ModelSpec) -> list[Kind]:
    """(label, membership test) of each kind of layout `best` is not and some of `layouts` are."""
    kinds: list[Kind] = []
    for tp in sorted({lay.tp for lay in layouts} - {best.tp}):
        kinds.append((f"TP {tp}", lambda lay, tp=tp: lay.tp == tp))
    if best.pp > 1:
        kinds.append(("no pipeline (PP 1)", lambda lay: lay.pp == 1))
        if best.vpp > 1:
            kinds.append(("pipeline without virtual stages", lambda lay: lay.pp > 1 and lay.vpp == 1))
        else:
            kinds.append(("interleaved pipeline (virtual stages)", lambda lay: lay.vpp > 1))
    else:
        kinds.append(("a pipeline (PP > 1)", lambda lay: lay.pp > 1))
    for sharding in sorted({lay.sharding for lay in layouts} - {best.sharding}):
        kinds.append((f"sharding {sharding}", lambda lay, s=sharding: lay.sharding == s))
    if best.cp > 1:
        kinds.append(("no context parallelism (CP 1)", lambda lay: lay.cp == 1))
    else:
        kinds.append(("context parallelism (CP > 1)", lambda lay: lay.cp > 1))
    if model.is_moe:
        for ep in sorted({lay.ep for lay in layouts} - {best.ep}):
            kinds.append((f"EP {ep}", lambda lay, ep=ep: lay.ep == ep))
    return [(label, keep) for label, keep in kinds if any(keep(lay) for lay in layouts)]


def why_it_loses(best, alternative) -> str:
    """The breakdown terms (planner.cost.Prediction.breakdown_s) that grow the most from the recommended plan's
    prediction to the alternative's, and the one that shrinks the most (what the alternative buys, e.g. expert
    parallelism's faster expert GEMMs against its all-to-alls), e.g.
    '+1.20 s exposed TP comm, +0.41 s pipeline bubble; -0.30 s compute'."""
    step = best.step_s
    grown = sorted(((alternative.breakdown_s.get(k, 0.0) - best.breakdown_s.get(k, 0.0), k) for k in TERM_LABEL),
                   reverse=True)
    named = [f"+{d:.3g} s {TERM_LABEL[k]}" for d, k in grown[:SHOWN_TERMS] if d > SMALLEST_SHOWN_SHARE * step]
    if alternative.step_s < step:
        return "predicted faster when its schedule is played; the search ranks layouts by the schedule's closed form"
    if not named:
        return "about the same in every term"
    shrunk, k = grown[-1]
    saved = f"; {shrunk:.3g} s {TERM_LABEL[k]}" if -shrunk > SMALLEST_SHOWN_SHARE * step else ""
    return ", ".join(named) + saved


def _alternatives(plans: list[Plan], candidates: list[_Candidate], model, shape, cluster, profile, pins,
                  limit: float) -> list[Alternative]:
    """For each kind of layout the first plan is not (alternative_kinds), its best layout by the same scoring as
    the search (bounds and greedy splits reused from it; no CP-SAT), with the schedule played, or the search's
    own runner-up of that kind where that plays faster."""
    best = plans[0]
    out = []
    scratch = SearchStats()  # the alternatives' work is not the search's
    for label, keep in alternative_kinds(best.layout, [c.layout for c in candidates], model):
        kind = [c for c in candidates if keep(c.layout)]
        scored, _, least, cut_short = _score(kind, shape, pins, limit, 1, scratch, None, ALTERNATIVE_SPLITS)
        if scored:
            _, c, stages = scored[0]
            found = [_plan_of(c, stages, c.cost.predict(stages), model, shape, cluster, profile)]
            plan = min(found + [p for p in plans[1:] if keep(p.layout)], key=lambda p: p.prediction.step_s)
            out.append(Alternative(label, plan, why_it_loses(best.prediction, plan.prediction)))
        elif cut_short:
            out.append(Alternative(label, None, f"none of its {4 * ALTERNATIVE_SPLITS} most promising layouts has a "
                                                f"greedy split within the {limit / mem.GIB:.1f} GiB allowed per GPU"))
        elif least is not None and least[0] > limit:
            out.append(Alternative(label, None, f"does not fit: each of its layouts needs at least "
                                                f"{least[0] / mem.GIB:.1f} GiB per GPU against the "
                                                f"{limit / mem.GIB:.1f} GiB allowed"))
        else:
            out.append(Alternative(label, None, "does not fit: no greedy layer split and recompute of its layouts "
                                                f"stays within the {limit / mem.GIB:.1f} GiB allowed per GPU"))
    return out
