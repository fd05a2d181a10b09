"""Lower bounds the search prunes with (planner/search/): for one layout, over every layer split and recompute
choice, the step time a plan of it reports (the schedule played, CostModel.predict), the search's score of a split
(the schedule's closed form) and the busiest rank's memory. A bound above the truth would drop a layout that could
win; tests/planner/search/test_search.py and tests/planner/test_bounds.py hold each below every split of hundreds of
layouts."""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner import memory as mem
from planner.cost import CostModel
from planner.plan import StagePlan, TrainingShape, num_micro_batches


def compute_bound_s(cm: CostModel, shape: TrainingShape, recompute: str | None = None) -> float:
    """A lower bound of time_and_memory_bounds' time bound from the layers' GPU time and MoE host time alone (no
    host floor, data-parallel traffic, optimizer or hops): cheap enough for every layout, so the full bounds are
    worked out only for layouts it cannot rule out."""
    lay, L = cm.lay, cm.layer
    num_micro = num_micro_batches(shape, lay)
    extra = {"full": L.full_recompute_s, "selective": L.selective_recompute_s}.get(recompute or "", 0.0)
    exposed_host = cm.stage_expert_host_s(StagePlan(1)) if lay.ep > 1 else 0.0
    total = cm.m.num_layers * (L.fwd_bwd_s + extra + exposed_host)
    return cm.schedule.lower_bound_s(lay.pp, num_micro, total, L.fwd_bwd_s, 0.0)


def whole_layers_bound_s(cm: CostModel, num_micro: int, gpu_layer_s: float, host_layer_s: float,
                         exposed_layer_s: float) -> float:
    """A lower bound of planner.schedules.base.fill_drain_bound_s over every split into whole layers: rank r with n_r layers
    takes at least t_r = max(n_r gpu_layer_s + e_r, n_r host_layer_s) + n_r exposed_layer_s (e_r: the embedding
    on rank 0, the head on the last; CostModel.stage_time_s), each rank holds at least vpp layers and the span is
    at least m t_r + r (gpu_layer_s + 2 hop) for every r. Layers go one at a time to the rank whose bound then
    stays least, which minimises the largest of these increasing functions."""
    lay, ends = cm.lay, cm.ends
    P, V, m = lay.pp, lay.vpp, num_micro
    e = [0.0] * P
    e[0] += ends.embedding_s
    e[P - 1] += ends.head_s + ends.head_comm_s
    fill = [r * (gpu_layer_s + 2 * cm.p2p_s) if P > 1 else 0.0 for r in range(P)]

    def span(r, n):
        return m * (max(n * gpu_layer_s + e[r], n * host_layer_s) + n * exposed_layer_s) + fill[r]

    # span(r, n) >= m (gpu + exposed) n + m e_r + fill_r: the ranks start at counts that stay below the least largest
    start = _counts_below_least_largest(P, V, cm.m.num_layers, span, m * (gpu_layer_s + exposed_layer_s),
                                        [m * e[r] + fill[r] for r in range(P)])
    return _least_largest(P, V, cm.m.num_layers, span, start)


def _least_largest(ranks: int, least_layers: int, num_layers: int, cost, start: list[int] | None = None) -> float:
    """The least, over every split of num_layers whole layers that gives each of `ranks` ranks at least
    least_layers, of the largest cost(r, n_r), for costs that do not decrease with n: layers go one at a time to
    the rank whose cost then stays least, which minimises the largest. start: counts to go on from, each rank's cost
    at most that least largest (_counts_below_least_largest); from them the same layer by layer ends at the same
    least largest, after fewer steps."""
    import heapq

    n = list(start) if start is not None else [least_layers] * ranks
    heap = [(cost(r, n[r] + 1), r) for r in range(ranks)]
    heapq.heapify(heap)
    for _ in range(num_layers - sum(n)):
        _, r = heapq.heappop(heap)
        n[r] += 1
        heapq.heappush(heap, (cost(r, n[r] + 1), r))
    return max(cost(r, n[r]) for r in range(ranks))


def _counts_below_least_largest(ranks: int, least_layers: int, num_layers: int, cost, slope: float,
                                offsets: list[float]) -> list[int] | None:
    """Per rank, the most layers (at least least_layers) whose cost stays at or below a floor of _least_largest's
    result, for costs at least slope n + offsets[r]: every split's largest cost is at least the mean of these
    lines, (slope num_layers + sum offsets) / ranks (taken a billionth lower, against rounding), so a rank at or
    below it is at or below the least largest. None where the slope gives no floor."""
    if not slope > 0:
        return None
    floor = (slope * num_layers + sum(offsets)) / ranks * (1 - 1e-9)
    counts = []
    for r in range(ranks):
        n = min(num_layers, int((floor - offsets[r]) // slope))
        while n > least_layers and cost(r, n) > floor:
            n -= 1
        counts.append(max(n, least_layers))
    return counts if sum(counts) <= num_layers else None


def least_recompute_s(cm: CostModel, limit: float) -> float:
    """A lower bound of the recompute seconds per micro-batch, summed over the layers, that fitting every rank in
    `limit` bytes takes. A rank r fits when F_r + sum of its layers (state + act_l * k_r) <= limit (F_r and k_r as
    in CostModel.memory_lower_bound_bytes), so the layers' activations sum to at most sum_r (limit - F_r) / k_r -
    state * L / max_r k_r. What no recompute would hold beyond that must be saved, at least_recompute_cost_s."""
    acts, n = cm.activations, cm.m.num_layers
    state_l, ranks = cm.rank_fixed_bytes
    room = sum((limit - (f + max(t, own))) / k for f, t, own, k in ranks) - state_l * n / max(k for *_, k in ranks)
    need = n * acts.none_bytes - room
    if need <= 0:
        return 0.0
    return least_recompute_cost_s(cm, need, n)


def least_recompute_cost_s(cm: CostModel, saved_bytes: float, layers: float) -> float:
    """The least recompute seconds per micro-batch that save `saved_bytes` of activations per micro-batch over
    `layers` layers, each recomputed selectively (saving d_s for s_s seconds), fully (d_f for s_f) or not, in
    fractions: a linear programme whose least lies at one of three points (all selective, all full, or every layer
    recomputed with the two mixed). Selective is the cheaper per byte but saves less; once it is not enough, each
    further byte costs (s_f - s_s) / (d_f - d_s) (llama3-70b's layer: 0.014 s/GiB fully against 0.005 selectively,
    so pricing every byte at the cheaper rate would let far more layouts through to a split).
    0 where neither mode saves anything; the all-full cost where even that cannot save enough (no split fits)."""
    acts, L = cm.activations, cm.layer
    d_s, s_s = acts.none_bytes - acts.selective_bytes, L.selective_recompute_s
    d_f, s_f = acts.none_bytes - acts.full_bytes, L.full_recompute_s
    options = []
    if d_s > 0 and saved_bytes <= layers * d_s:
        options.append(saved_bytes * s_s / d_s)
    if d_f > 0 and saved_bytes <= layers * d_f:
        options.append(saved_bytes * s_f / d_f)
    if d_f > d_s > 0 and layers * d_s <= saved_bytes <= layers * d_f:
        options.append(layers * s_s + (saved_bytes - layers * d_s) * (s_f - s_s) / (d_f - d_s))
    if options:
        return min(options)
    return layers * s_f if d_f > 0 else 0.0


def time_and_memory_bounds(cm: CostModel, shape: TrainingShape, recompute: str | None = None,
                           limit: float = math.inf) -> tuple[float, float]:
    """(time lower bound, memory lower bound) over every split and recompute choice of this layout; with the
    memory `limit`, the time bound counts the least recompute that fitting in it takes."""
    return time_bound_s(cm, shape, recompute, limit), memory_bound_bytes(cm, recompute)


@dataclass(frozen=True)
class _LayerFloors:
    """What every split of a layout pays at least, per layer and in all (time_bound_s, closed_form_bound_s)."""
    gpu_layer_s: float
    """A layer's forward + backward on the GPU, with the pinned recompute's."""
    host_layer_s: float
    """A layer's host time at its cheapest recompute mode, less the MoE host time EP exposes (0 without host pacing)."""
    exposed_layer_s: float
    """The MoE host time EP's synchronisation exposes per layer (CostModel.stage_expert_host_s)."""
    total_s: float
    """The stages' times per micro-batch summed: at least max(sum GPU, sum host) + sum exposed, the GPU's with the
    least recompute that fitting in the limit takes."""


def _layer_floors(cm: CostModel, recompute: str | None, limit: float) -> _LayerFloors:
    """The layout's _LayerFloors under the recompute pin and the memory limit."""
    lay, m, L = cm.lay, cm.m, cm.layer
    extra = {"full": L.full_recompute_s, "selective": L.selective_recompute_s}.get(recompute or "", 0.0)
    # a stage costs max(GPU, host less the MoE's exposed host time) + that exposed time (CostModel.stage_time_s);
    # summed over stages that is at least max(sum GPU, sum host) + sum exposed, with each layer's host time at
    # its cheapest recompute mode
    one = {"full": StagePlan(1, 1, 0), "selective": StagePlan(1, 0, 1)}.get(recompute or "", StagePlan(1))
    exposed_host = cm.stage_expert_host_s(one)
    host_layer = 0.0
    if cm.prof.host is not None and not lay.cuda_graph:
        modes = [recompute] if recompute else list(cm.host_per_layer_s)
        host_layer = min(cm.host_per_layer_s[k] for k in modes) * cm.prof.eff("host") - exposed_host
    pinned_extra = extra
    if not recompute and limit < math.inf:
        extra = least_recompute_s(cm, limit) / m.num_layers
    gpu_total = m.num_layers * (L.fwd_bwd_s + extra) + cm.ends.embedding_s + cm.ends.head_s + cm.ends.head_comm_s
    total = max(gpu_total, m.num_layers * host_layer) + m.num_layers * exposed_host
    return _LayerFloors(L.fwd_bwd_s + pinned_extra, host_layer, exposed_host, total)


def time_bound_s(cm: CostModel, shape: TrainingShape, recompute: str | None = None, limit: float = math.inf) -> float:
    """A lower bound of the step (the schedule played, CostModel.predict) over every split and recompute choice of
    this layout; with the memory `limit`, it counts the least recompute that fitting in it takes."""
    lay, m = cm.lay, cm.m
    L = cm.layer
    num_micro = num_micro_batches(shape, lay)
    stages = lay.pp * lay.vpp
    floors = _layer_floors(cm, recompute, limit)
    # a lower bound of the played schedule (CostModel.predict, the step a plan reports and is ranked by) over
    # every split: each stage holds at least one layer (PipelineSchedule.lower_bound_s)
    pipe = cm.schedule.lower_bound_s(lay.pp, num_micro, floors.total_s, L.fwd_bwd_s, cm.p2p_s)
    if cm.schedule.fill_drain_bound_holds:
        pipe = max(pipe, whole_layers_bound_s(cm, num_micro, floors.gpu_layer_s, floors.host_layer_s,
                                              floors.exposed_layer_s))
    # data-parallel traffic and optimizer of a rank with the fewest layers the busiest rank can hold, without the
    # embedding and head (which sit on one rank each)
    bound_layers = max(m.num_layers // stages, 1) * lay.vpp
    dense, expert = cm.params_of(bound_layers, lay.pp == 1, lay.pp == 1)
    layers = m.num_layers / lay.pp
    dp = cm.dp_comm_s(dense, expert, layers * L.fwd_s, layers * (L.bwd_compute_s + L.bwd_comm_s), num_micro)
    return pipe + dp + cm.optimizer_s(dense, expert, cm.fused_wgrad_params(bound_layers, lay.pp == 1, lay.pp == 1))


def closed_form_bound_s(cm: CostModel, recompute: str | None = None, limit: float = math.inf) -> float:
    """A lower bound of the search's score of a split (CostModel.predict(play=False): the schedule's closed form
    m max_r T_r + (sum_r T_r - max_r T_r) / v over the ranks' times per micro-batch, plus the hops on its path
    (closed_form_hops, the same for every split), plus data-parallel and optimizer time, counted here as 0) over
    every split that fits in `limit`: the search splits no layout whose bound is above the scores it must beat
    (scoring._score). The form grows with max_r T_r and with sum_r T_r, which are at least
    - sum: _LayerFloors.total_s;
    - max: the mean, and the least over whole-layer splits of the largest t_r, rank r with n_r layers
      taking t_r = max(n_r gpu + e_r + rec_r, n_r host) + n_r exposed (e_r: the embedding or head it holds) and
      rec_r the least recompute that fits it: F_r + n_r state + k_r sum of its layers' activations <= limit
      (rank_fixed_bytes, as least_recompute_s has it for all ranks together), at least_recompute_cost_s.
    Only for schedules priced by PipelineSchedule's own closed form and span (others: 0.0, no bound)."""
    from planner.schedules.base import PipelineSchedule, closed_form_hops

    sched, lay = type(cm.schedule), cm.lay
    if sched.span_s is not PipelineSchedule.span_s or sched.closed_form_s is not PipelineSchedule.closed_form_s \
            or cm.schedule.micro_batch_share != 1.0:
        return 0.0
    P, V, m = lay.pp, lay.vpp, cm.num_micro
    floors = _layer_floors(cm, recompute, limit)
    busiest = _least_largest(P, V, cm.m.num_layers, _rank_time_floor(cm, floors, recompute, limit))
    if P == 1:  # one rank, no hops: m x_0
        return m * max(busiest, floors.total_s)
    largest = max(busiest, floors.total_s / P)
    return m * largest + (floors.total_s - largest) / V + closed_form_hops(P, V, m) * cm.p2p_s


def _rank_time_floor(cm: CostModel, floors: _LayerFloors, recompute: str | None, limit: float):
    """t(r, n): a lower bound of pipeline rank r's time per micro-batch when it holds n layers (closed_form_bound_s),
    non-decreasing in n (each further layer adds at least as many bytes to save as recomputing it can save)."""
    lay, ends, acts = cm.lay, cm.ends, cm.activations
    P, S = lay.pp, lay.pp * lay.vpp
    e = [0.0] * P
    e[cm.schedule.rank_of_stage(P, 0)] += ends.embedding_s
    e[cm.schedule.rank_of_stage(P, S - 1)] += ends.head_s + ends.head_comm_s
    gpu, host, exposed = floors.gpu_layer_s, floors.host_layer_s, floors.exposed_layer_s
    state_l, ranks = cm.rank_fixed_bytes
    saves = not recompute and limit < math.inf  # the least recompute is counted only where none is pinned

    def rank_s(r, n):
        rec = 0.0
        fixed, transient, own_transient, k = ranks[r]
        if saves and k > 0:
            need = (fixed + max(transient, own_transient) + n * (state_l + k * acts.none_bytes) - limit) / k
            if need > 0:
                rec = least_recompute_cost_s(cm, need, n)
        return max(n * gpu + e[r] + rec, n * host) + n * exposed

    return rank_s


def memory_bound_bytes(cm: CostModel, recompute: str | None = None) -> float:
    """A lower bound of the busiest rank's memory over every split and recompute choice of this layout (the
    pin's, when `recompute` pins one): a layout whose bound exceeds the limit has no split that fits."""
    lay, m = cm.lay, cm.m
    # every layer keeps at least its recompute mode's activations; the busiest rank holds at least the mean over
    # ranks (one micro-batch in flight each), and at least what the layers spread evenly over the ranks' fixed
    # bytes and in-flight counts leave (CostModel.memory_lower_bound_bytes)
    acts = cm.activations
    per_layer_act = {"none": acts.none_bytes, "selective": acts.selective_bytes}.get(recompute or "",
                                                                                   acts.full_bytes)
    total_dense, total_expert = cm.params_of(m.num_layers, True, True)
    mean_lb = (mem.state_bytes(total_dense, total_expert, lay, cm.target.expert_states_over_tp,
                               sharded_grads=cm.fsdp_grads_at_peak, storage=cm.target.state_storage)
               + m.num_layers * per_layer_act) / lay.pp \
        + mem.fsdp_gather_bytes(m, lay)
    # a rank with any fully recomputed layer also holds one layer's activations while it rematerialises them, so
    # free recompute is bounded by the lesser of all-selective and all-full with that transient
    if recompute:
        spread = cm.memory_lower_bound_bytes(per_layer_act, acts.none_bytes if recompute == "full" else 0.0)
    else:
        spread = min(cm.memory_lower_bound_bytes(acts.selective_bytes),
                     cm.memory_lower_bound_bytes(acts.full_bytes, acts.none_bytes))
    return max(mean_lb, spread)
