"""Lower bounds the search prunes with (planner/search/): for one layout, over every layer split and recompute
choice, the step time a plan of it reports (the schedule played, CostModel.predict) and the busiest rank's
memory. A bound above the truth would drop a layout that could win; tests/planner/search/test_search.py
holds each below every split of hundreds of layouts."""
from __future__ import annotations

import math

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
    import heapq

    lay, ends = cm.lay, cm.ends
    P, V, m = lay.pp, lay.vpp, num_micro
    e = [0.0] * P
    e[0] += ends.embedding_s
    e[P - 1] += ends.head_s + ends.head_comm_s
    fill = [r * (gpu_layer_s + 2 * cm.p2p_s) if P > 1 else 0.0 for r in range(P)]

    def span(r, n):
        return m * (max(n * gpu_layer_s + e[r], n * host_layer_s) + n * exposed_layer_s) + fill[r]

    n = [V] * P
    heap = [(span(r, V + 1), r) for r in range(P)]
    heapq.heapify(heap)
    for _ in range(cm.m.num_layers - P * V):
        _, r = heapq.heappop(heap)
        n[r] += 1
        heapq.heappush(heap, (span(r, n[r] + 1), r))
    return max(span(r, n[r]) for r in range(P))


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


def time_bound_s(cm: CostModel, shape: TrainingShape, recompute: str | None = None, limit: float = math.inf) -> float:
    """A lower bound of the step (the schedule played, CostModel.predict) over every split and recompute choice of
    this layout; with the memory `limit`, it counts the least recompute that fitting in it takes."""
    lay, m = cm.lay, cm.m
    L = cm.layer
    num_micro = num_micro_batches(shape, lay)
    stages = lay.pp * lay.vpp
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
    # a lower bound of the played schedule (CostModel.predict, the step a plan reports and is ranked by) over
    # every split: each stage holds at least one layer (PipelineSchedule.lower_bound_s)
    pipe = cm.schedule.lower_bound_s(lay.pp, num_micro, total, L.fwd_bwd_s, cm.p2p_s)
    if cm.schedule.fill_drain_bound_holds:
        pipe = max(pipe, whole_layers_bound_s(cm, num_micro, L.fwd_bwd_s + pinned_extra, host_layer,
                                              exposed_host))
    # data-parallel traffic and optimizer of a rank with the fewest layers the busiest rank can hold, without the
    # embedding and head (which sit on one rank each)
    bound_layers = max(m.num_layers // stages, 1) * lay.vpp
    dense, expert = cm.params_of(bound_layers, lay.pp == 1, lay.pp == 1)
    layers = m.num_layers / lay.pp
    dp = cm.dp_comm_s(dense, expert, layers * L.fwd_s, layers * (L.bwd_compute_s + L.bwd_comm_s), num_micro)
    return pipe + dp + cm.optimizer_s(dense, expert, cm.fused_wgrad_params(bound_layers, lay.pp == 1, lay.pp == 1))


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
    mean_lb = (mem.state_bytes(total_dense, total_expert, lay, cm.target.expert_states_over_tp)
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
