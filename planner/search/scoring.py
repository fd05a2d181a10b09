"""Candidates of the branch and bound: a layout with its cost model and bounds, scored in order of their bounds by a
greedy split, and the Plan made of a candidate's split with its provenance."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from planner import memory as mem
from planner.bounds import closed_form_bound_s, memory_bound_bytes, time_bound_s
from planner.cost import CostModel
from planner.plan import Layout, Plan, StagePlan, TrainingShape
from planner.profile import FP8_MODEL_NOTE, Profile, profile_argument
from planner.search.result import Pins, SearchStats
from planner.search.stages import greedy_stages, solve_stages


@dataclass
class _Candidate:
    layout: Layout
    cost: CostModel
    compute_bound_s: float
    """bounds.compute_bound_s: cheap, below time_bound_s; the order the layouts are examined in."""
    time_bound_s: float = math.nan
    memory_bound_bytes: float = math.nan
    """bounds.memory_bound_bytes and bounds.time_bound_s (_bound_fully), worked out only for layouts whose compute
    bound could still beat the k-th best plan; the time bound is inf where the memory bound exceeds the limit."""
    score_bound_s: float = math.nan
    """bounds.closed_form_bound_s (with the limit): below the score of any split of it that fits, worked out only
    for layouts the score reaches (math.nan until then)."""
    greedy: list[StagePlan] | None = None
    greedy_tried: bool = False
    """greedy_stages, kept for the alternatives' searches (None: no split fits, or not tried yet)."""
    split_proven: bool = False
    """Whether its evaluated split is proven the best of its layout: every choice played (enumerate_stages), or
    CP-SAT's solve ended optimal (for its closed-form model of the schedule)."""
    played: dict = field(default_factory=dict)
    """tuple(stages) -> its Prediction with the schedule played (play): a play costs milliseconds, and the search
    asks again for the splits it shows."""

    def play(self, stages: list[StagePlan]):
        """CostModel.predict(stages), the schedule played, worked out once per split."""
        key = tuple(stages)
        pred = self.played.get(key)
        if pred is None:
            pred = self.played[key] = self.cost.predict(stages)
        return pred


SCORE_BOUND_MARGIN = 1e-9
"""A layout is left unsplit only when its score bound exceeds the k-th best score by more than this share: the
bound and the score sum the same terms in different orders, so they can differ by a few units in the last place."""


def _bound_fully(c: _Candidate, shape: TrainingShape, recompute: str | None, limit: float,
                 stats: SearchStats) -> None:
    """Give candidate c its full bounds, once: memory first, then time only where the memory bound is within the
    limit. A layout whose memory bound exceeds it has no split that fits, so no step: its time bound is inf (no
    search reads the time bound of a layout that cannot fit)."""
    if not math.isnan(c.time_bound_s):
        return
    c.memory_bound_bytes = memory_bound_bytes(c.cost, recompute)
    fits = c.memory_bound_bytes <= limit
    c.time_bound_s = time_bound_s(c.cost, shape, recompute, limit) if fits else math.inf
    stats.layouts_bounded += 1
    stats.layouts_fit_bound += fits


def _score(candidates: list[_Candidate], shape: TrainingShape, pins: Pins, limit: float, top_k: int,
           stats: SearchStats, solve_work: float | None, max_splits: float = math.inf):
    """The top_k candidates by the score of a split (CostModel.predict(play=False)): best bound first, a layout
    known by its compute bound gets its full bounds (memory, and time with communication and optimizer) and goes
    back in line; one known by its full bound gets a greedy split (CP-SAT where that finds none, while fewer than
    top_k are scored, unless solve_work is None). So the splits come in the order of the full bounds, and only
    layouts whose compute bound is below the k-th best are bounded in full. Bounds and splits are kept on the
    candidates for later calls. Returns (scored [(score, candidate, stages)], the lowest bound of the layouts not
    scored, (least memory bound, its layout) among those bounded, whether max_splits cut the search short).
    max_splits: stop after splitting that many layouts, or trying four times as many (the alternatives' searches:
    their best among the most promising, not proven best)."""
    queue = [(c.compute_bound_s, i, False) for i, c in enumerate(candidates)]
    heapq.heapify(queue)
    scored: list[tuple[float, _Candidate, list[StagePlan]]] = []
    kth = math.inf
    unsettled_bound = math.inf
    min_mem: tuple[float, Layout] | None = None
    splits = tries = 0  # layouts split, and split or tried (a greedy split can find nothing within memory)
    while queue and splits < max_splits and tries < 4 * max_splits:
        bound_s, i, bounded = heapq.heappop(queue)
        if bound_s >= kth:  # so is every layout's still in line
            unsettled_bound = bound_s
            break
        c = candidates[i]
        if not bounded:
            _bound_fully(c, shape, pins.recompute, limit, stats)
            if min_mem is None or c.memory_bound_bytes < min_mem[0]:
                min_mem = (c.memory_bound_bytes, c.layout)
            if c.memory_bound_bytes <= limit:
                heapq.heappush(queue, (c.time_bound_s, i, True))
            continue
        if kth < math.inf and max_splits == math.inf and not c.greedy_tried:
            # a split of it would score above the k-th best and change nothing; with max_splits every split
            # counts, so there every layout in line is split
            if math.isnan(c.score_bound_s):
                c.score_bound_s = closed_form_bound_s(c.cost, pins.recompute, limit)
            if c.score_bound_s > kth * (1 + SCORE_BOUND_MARGIN):
                continue
        if not c.greedy_tried:
            c.greedy, c.greedy_tried = greedy_stages(c.cost, shape, limit, pins.recompute), True
            stats.layouts_greedy += 1
        stages = c.greedy
        tries += 1
        if stages is None and len(scored) < top_k and solve_work is not None:
            stages = solve_stages(c.cost, shape, limit, pins.recompute, work_limit=solve_work).stages
            stats.layouts_solved += 1
        if stages is None:
            continue
        splits += 1
        step = c.cost.predict(stages, play=False).step_s
        scored.append((step, c, stages))
        scored.sort(key=lambda x: x[0])
        if len(scored) >= top_k:
            kth = scored[top_k - 1][0]
    return scored, unsettled_bound, min_mem, bool(queue) and (splits >= max_splits or tries >= 4 * max_splits)


def _plan_of(c: _Candidate, stages: list[StagePlan], pred, model, shape, cluster, profile) -> Plan:
    prov = plan_provenance(profile, c.layout.fp8)
    off_grid, queries = c.cost.interpolated_gemms()
    if off_grid:  # say so: between the grid's points cuBLAS can run 10-30% off the interpolated rate
        prov["modelled"].insert(0, f"GEMMs: {off_grid} of this layout's {queries} layer GEMM shapes interpolated "
                                   f"between profile points (`plan profile --model {model.name} --base "
                                   f"{profile_argument(profile)}` measures them and adds them to this profile)")
    if model.is_moe and not profile.grouped_points:
        prov["modelled"].insert(0, "MoE experts: the profile has no grouped-GEMM measurements, so each expert is "
                                   "priced as its own small GEMM, which overstates few rows per expert (`python -m "
                                   "runtime.profiler.grouped --profile ... --out ...` measures them)")
    if not profile.attention_measured(model.head_dim, model.causal):
        as_dim = profile.attention_kernel_head_dim(model.head_dim, model.causal)
        how = (f"priced as {as_dim}, the next larger one measured (kernels pad to their tile)" if as_dim != model.head_dim
               else "read at the nearest measured one's rate")
        prov["modelled"].insert(0, f"attention: head dimension {model.head_dim} not measured, {how} (`plan profile "
                                   f"--model {model.name} --base {profile_argument(profile)}` measures it)")
    layout = c.layout if c.layout.schedule == c.cost.schedule.name else replace(c.layout, schedule=c.cost.schedule.name)
    return Plan(model=model, cluster=cluster.to_dict(), training=shape, layout=layout, stages=stages,
                prediction=pred, provenance=prov, runtime=c.cost.target.name)


def plan_provenance(profile: Profile, fp8: bool = False) -> dict:
    """Which profile the times came from, and which of its figures are measured and which modelled."""
    prov = profile.provenance
    measured, modelled = list(prov.get("measured", [])), list(prov.get("modelled", []))
    if fp8 and not profile.fp8_measured:
        modelled.append(FP8_MODEL_NOTE)
    for part in prov.get("parts", []):
        status = str(part.get("status", ""))
        text = part.get("part", "?") + (f" ({part['model']})" if "model" in part else "")
        (measured if status == "measured" else modelled).append(text if status in ("measured", "modelled")
                                                                else f"{text}: {status}")
    return {"profile": profile.source_path or profile.gpu, "profile_gpu": profile.gpu,
            "profile_measured_on": prov.get("gpu_name", prov.get("measured_on", "")),
            "profile_date": prov.get("date", ""), "profile_commit": prov.get("git_commit", ""),
            "profile_kind": ("derived from " + str(prov["derived_from"].get("gpu_name", "another GPU"))
                             if isinstance(prov.get("derived_from"), dict) else prov.get("kind", prov.get("mode", "measured"))),
            "measured": measured,
            "modelled": modelled + [f"memory allowance: {mem.RESERVED_GIB} GiB outside the allocator, "
                                    f"{mem.FRAGMENTATION:.0%} fragmentation"],
            "profile_warnings": ([f"host time per layer out of recompute order (probe noise; recompute choices of "
                                  f"host-paced plans may be misjudged): {v}"
                                  for v in profile.host.recompute_order_violations()]
                                 if profile.host is not None else [])}
