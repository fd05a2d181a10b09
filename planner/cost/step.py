"""CostModel: one (model, shape, layout) on one cluster with one profile, its terms (planner/cost/*.py) assembled
into a plan's step time, memory and breakdown."""
from __future__ import annotations

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost.comm import CommTerms
from planner.cost.data_parallel import DataParallelTerms
from planner.cost.host import HostTerms
from planner.cost.layer import LayerTerms
from planner.memory.ranks import MemoryTermsOfRanks
from planner.cost.targets import OURS, RuntimeTarget
from planner.cost.terms import cached_property
from planner.model import ModelSpec
from planner.plan import Layout, Plan, Prediction, StagePlan, TrainingShape, num_micro_batches
from planner.profile import Profile
from planner.schedules import DUAL_PIPE, ONE_F_ONE_B, PipelineSchedule, schedule_named


class CostModel(LayerTerms, CommTerms, HostTerms, MemoryTermsOfRanks, DataParallelTerms):
    """Costs of one (model, shape, layout) on one cluster with one profile; the search builds one per
    candidate layout and asks it about many stage splits.

    The five mixins share this object's state and call each other through `self`. Their contract:

    - CostModel itself provides the inputs `m` (ModelSpec), `shape`, `lay` (Layout), `cluster`, `prof` (Profile),
      `target` (RuntimeTarget), `_shared` (the search's memo) and `_memo(name, fn)` (memoised by `layer_key`), and
      `num_micro`, `schedule`, `rank_chunks`, `in_flight_peaks`, `dispatch_chunks`, `stacks_expert_weights`,
      `_ep_beside_layer`, the stage times (`stage_time_s`, `stage_gpu_s`, `stage_fwd_share`) and `predict`.
    - CommTerms (cost/comm.py) needs m, lay, cluster, prof, target, tokens, _shared; provides `group_collective_s`,
      `strides`, `p2p_s`, `_network_fit`.
    - LayerTerms (cost/layer.py, its MoE part MoeTerms in cost/moe_layer.py) needs m, shape, lay, cluster, prof, target, _memo, dispatch_chunks,
      stacks_expert_weights, _ep_beside_layer, group_collective_s, strides, _network_fit, _moe_row_passes_s;
      provides `layer` (LayerCosts), `ends` (EndCosts), `activations`, `tokens`.
    - HostTerms (cost/host.py) needs m, lay, prof, target, dispatch_chunks, _shared; provides `stage_host_s`,
      `stage_expert_host_s`, `host_per_layer_s`, `extra_chunk_host_s`.
    - MemoryTermsOfRanks (planner/memory/ranks.py) needs m, shape, lay, cluster, target, _memo, activations, num_micro,
      rank_chunks, in_flight_peaks; provides `rank_memory_bytes`, `memory_terms`, `params_of`, `rank_params`,
      `per_layer_params`, `rank_fixed_bytes`, `memory_lower_bound_bytes`.
    - DataParallelTerms (cost/data_parallel.py) needs m, shape, lay, cluster, prof, target, num_micro, group_collective_s,
      strides; provides `dp_comm_s`, `optimizer_s`, `fused_wgrad_params`, `tp_grad_reduce_s`,
      `param_bookkeeping_s`, `_moe_row_passes_s`.
    """

    def __init__(self, model: ModelSpec, shape: TrainingShape, layout: Layout, cluster: ClusterSpec,
                 profile: Profile, shared: dict | None = None, target: RuntimeTarget = OURS):
        # a step replayed as a CUDA graph pays each kernel's GPU start, not the host's launch (Profile.graph_kernel_s)
        self.prof = profile.for_graph_replay() if layout.cuda_graph and profile is not None else profile
        self.m, self.shape, self.lay, self.cluster = model, shape, layout, cluster
        self.target = target
        """The runtime predicted for (planner/cost/targets.py): its named factors scale the terms below."""
        # layer and end costs depend only on (tp, cp, ep, micro-batch, overlap, fp8, gradient precision): a
        # search shares them
        self._shared = shared if shared is not None else {}
        self.layer_key = (layout.tp, layout.cp, layout.ep, layout.micro_batch, layout.overlap_tp, layout.fp8,
                          layout.grad_dtype, self.dispatch_chunks, self._ep_beside_layer, self.stacks_expert_weights,
                          target,
                          layout.cuda_graph and getattr(profile, "graph_kernel_s", None) is not None)
        """What a layer's price depends on: the key of its memo in `shared`."""

    @property
    def stacks_expert_weights(self) -> bool:
        """Whether the MoE layer copies its local expert weights into one tensor per use (sharding levels whose
        buffers cannot hold them back to back; see _layer): part of the layer's price, so of its memo key."""
        return self.m.is_moe and self.lay.sharding in ("optimizer+grads", "full")

    @property
    def dispatch_chunks(self) -> int:
        """Chunks an MoE layer dispatches its tokens in (runtime/parallel/expert.py, MoEMLP.dispatch_chunks)."""
        return 2 if self.lay.overlap_ep and self.lay.ep > 1 and self.m.is_moe and self.target.two_chunk_dispatch else 1

    @property
    def _ep_beside_layer(self) -> bool:
        """Whether an MoE layer's one dispatch prices its all-to-alls beside the other micro-batch's whole layer
        (RuntimeTarget.ep_a2a_beside_layer): the target runs that overlap and the layout admits Megatron's
        combined 1F1B schedule (no pipeline, or an interleaved one: TransformerConfig asserts a virtual pipeline
        size when PP > 1) and the plan turns it on (Layout.overlap_ep)."""
        return (self.target.ep_a2a_beside_layer and self.lay.overlap_ep and self.m.is_moe and self.lay.ep > 1
                and (self.lay.pp == 1 or self.lay.vpp > 1 or self.dual_pipe))

    @cached_property
    def num_micro(self) -> int:
        """Micro-batches per step on each data-parallel rank."""
        return num_micro_batches(self.shape, self.lay)

    @cached_property
    def schedule(self) -> PipelineSchedule:
        """The pipeline schedule priced: the layout's (Layout.schedule), or DualPipe in place of 1F1B where the
        target runs it (RuntimeTarget.dual_pipe) and the layout admits it (DualPipe.violation)."""
        lay = self.lay
        if (self.target.dual_pipe and lay.schedule == ONE_F_ONE_B.name
                and DUAL_PIPE.violation(lay.pp, lay.vpp, self.num_micro) is None):
            return DUAL_PIPE
        return schedule_named(lay.schedule)

    @property
    def dual_pipe(self) -> bool:
        """Whether the pipeline runs DualPipe (CostModel.schedule)."""
        return self.schedule is DUAL_PIPE

    def rank_chunks(self, rank: int) -> list[int]:
        """The (virtual) stages pipeline rank `rank` holds (PipelineSchedule.rank_chunks)."""
        return self.schedule.rank_chunks(self.lay.pp, self.lay.vpp, rank)

    def in_flight_peaks(self, rank: int, num_micro: int) -> tuple[tuple[int, ...], ...]:
        """The micro-batches each of the rank's chunks (rank_chunks) holds at each moment that can be its peak
        (PipelineSchedule.in_flight_peaks)."""
        return self.schedule.in_flight_peaks(self.lay.pp, self.lay.vpp, num_micro, rank)

    def _memo(self, name, fn):
        k = (name, self.layer_key)
        v = self._shared.get(k)
        if v is None:
            v = self._shared[k] = fn()
        return v


    # -- per rank -------------------------------------------------------------------------------------
    def stage_time_s(self, j: int, st: StagePlan) -> float:
        """Forward + backward of one micro-batch through virtual stage j, recompute included: the GPU's
        time, or the host's when issuing the kernels takes longer (stage_host_s), plus the host time that
        MoE layers under expert parallelism cannot hide (stage_expert_host_s)."""
        host = self.stage_host_s(j, st)
        expert = self.stage_expert_host_s(st)
        return max(self.stage_gpu_s(j, st), host - expert) + expert


    def stage_gpu_s(self, j: int, st: StagePlan) -> float:
        L = self.layer
        t = st.layers * L.fwd_bwd_s + st.full_recompute_layers * L.full_recompute_s \
            + st.selective_recompute_layers * L.selective_recompute_s
        if j == 0:
            t += self.ends.embedding_s
        if j == self.lay.pp * self.lay.vpp - 1:
            t += self.ends.head_s + self.ends.head_comm_s
        return t

    def stage_fwd_share(self, j: int, st: StagePlan) -> float:
        """The forward's share of virtual stage j's GPU time (for the schedule play; recompute runs in the
        backward, and the head's forward is its output GEMM, a third of its forward + backward)."""
        L = self.layer
        fwd = st.layers * L.fwd_s + (self.ends.embedding_s if j == 0 else 0.0)
        if j == self.lay.pp * self.lay.vpp - 1:
            fwd += self.ends.head_s / 3
        gpu = self.stage_gpu_s(j, st)
        return fwd / gpu if gpu > 0 else 0.5


    def predict(self, stages: list[StagePlan], play: bool = True) -> Prediction:
        """The plan's step time, memory and breakdown. play=False times a pipeline by the schedule's closed
        form (PipelineSchedule.span_s) with every hop on the path, instead of playing the schedule:
        the search scores its candidates that way (a play costs milliseconds) and plays the plans it keeps."""
        lay, m = self.lay, self.m
        num_micro = self.num_micro
        per_rank_t, mems, dp_t, opt_t, tpg_t = [], [], [], [], []
        times = [self.stage_time_s(j, st) for j, st in enumerate(stages)]
        share = self.schedule.micro_batch_share
        for r in range(lay.pp):
            rs = [(j, stages[j]) for j in self.rank_chunks(r)]
            t_r = share * sum(times[j] for j, _ in rs)
            per_rank_t.append(t_r)
            mems.append(self.rank_memory_bytes(r, rs, num_micro))
            dense, expert = self.rank_params(rs)
            L = self.layer
            layers = sum(st.layers for _, st in rs)
            last = any(j == lay.pp * lay.vpp - 1 for j, _ in rs)
            first = any(j == 0 for j, _ in rs)
            dp_t.append(self.dp_comm_s(dense, expert, layers * L.fwd_s, layers * (L.bwd_compute_s + L.bwd_comm_s), num_micro)
                        + self.tied_embedding_reduce_s(first, last))
            opt_t.append(self.optimizer_s(dense, expert, self.fused_wgrad_params(layers, last, first)))
            tpg_t.append(self.tp_grad_reduce_s(layers, first, last, num_micro))
        t_max = max(per_rank_t)

        def stage_split():  # each virtual stage's (forward, backward) seconds, for the schedule's play
            fwd = [t * self.stage_fwd_share(j, st) for j, (t, st) in enumerate(zip(times, stages))]
            return fwd, [t - f for t, f in zip(times, fwd)]

        pipe, ideal = self.schedule.span_s(lay.pp, lay.vpp, num_micro, per_rank_t, stage_split, self.p2p_s, play)
        # after the pipeline: the data-parallel reduction left exposed and the TP reduction of replicated
        # parameters' gradients (both in the last backward's hooks), then the optimizer
        ends_t = [d + g for d, g in zip(dp_t, tpg_t)]
        step = pipe + max(ends_t) + max(opt_t)
        # breakdown along the slowest rank
        r = per_rank_t.index(t_max)
        rs = [(j, stages[j]) for j in self.rank_chunks(r)]
        L = self.layer
        layers = share * sum(st.layers for _, st in rs)
        recompute = share * sum(st.full_recompute_layers * L.full_recompute_s
                                + st.selective_recompute_layers * L.selective_recompute_s for _, st in rs)
        ends = share * sum((self.ends.embedding_s if j == 0 else 0.0)
                           + (self.ends.head_s if j == len(stages) - 1 else 0.0) for j, _ in rs)
        head_comm = share * sum(self.ends.head_comm_s for j, _ in rs if j == len(stages) - 1)
        host_bound = num_micro * share * sum(self.stage_time_s(j, st) - self.stage_gpu_s(j, st) for j, st in rs)
        breakdown = {
            "compute": num_micro * (layers * (L.fwd_compute_s + L.bwd_compute_s) + ends),
            "host": host_bound,
            "recompute": num_micro * recompute,
            "tp_comm": num_micro * (layers * L.comm_by_dim_s["tp"] + head_comm) + max(ends_t) - max(dp_t),
            "cp_comm": num_micro * layers * L.comm_by_dim_s["cp"],
            "ep_comm": num_micro * layers * L.comm_by_dim_s["ep"],
            # what the schedule adds beyond its closed form: hops waited for, and uneven chunks' fill and drain
            "pp_comm": max(0.0, pipe - ideal),
            "bubble": min(pipe, ideal) - num_micro * t_max,
            "dp_comm": max(dp_t),
            "optimizer": max(opt_t),
        }
        tokens = self.shape.global_batch * self.shape.seq_len
        flops = m.model_flops_per_token(self.shape.seq_len) * tokens
        n = lay.world_size
        kind = self.cluster.kind
        return Prediction(step_s=step, tokens_per_s=tokens / step, tflops_per_gpu=flops / step / n / 1e12,
                          mfu=flops / step / n / (kind.peak_bf16_tflops * 1e12),
                          memory_gib_per_rank=[b / mem.GIB for b in mems],
                          memory_limit_gib=mem.plan_memory_limit_bytes(self.cluster) / mem.GIB,
                          breakdown_s=breakdown)


def evaluate(plan: Plan, cluster: ClusterSpec, profile: Profile, runtime: str | None = None) -> Prediction:
    """The plan's prediction for the runtime it names (Plan.runtime), or for `runtime`; a runtime that cannot
    capture CUDA graphs runs the plan's layout eagerly."""
    from dataclasses import replace

    from planner.cost.targets import load_target

    target = load_target(runtime or plan.runtime)
    layout = plan.layout if target.cuda_graph or not plan.layout.cuda_graph else replace(plan.layout, cuda_graph=False)
    return CostModel(plan.model, plan.training, layout, cluster, profile, target=target).predict(plan.stages)
