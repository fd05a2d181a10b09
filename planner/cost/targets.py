"""Prediction targets: which training runtime the cost model predicts for (`plan --runtime ours|megatron`).

`ours` is this project's runtime (runtime/): every term as the profile and the rest of planner/cost/ price it. Its
data-parallel overlap runs the same bucket mechanism as Megatron's below (40M-parameter buckets reduced as backward
fills them, a chunk's after its last micro-batch, the gathers waited for per module in the next forward), with the
profile's calibrated DP fraction as its one factor: the contention is one less that fraction.

`megatron` is Megatron-Core with Transformer Engine as users run it (Megatron-LM's pretrain_gpt with TE layers):
- its kernels (TE's fused GEMMs, attention and elementwise kernels) at `compute_factor` times our kernels' GPU time
  (fitted: what TE gains or loses against the profile's measured kernels, elementwise work priced like ours);
- FP8 where the layout asks for it: forward, input-gradient and weight-gradient GEMMs at the profile's FP8 rates
  (TE's FP8 recipe runs all three in FP8; ours keeps wgrad in bf16), the MoE experts' grouped GEMMs too (TE's
  GroupedLinear; ours keeps them in bf16), times `fp8_gemm_factor` (fitted: TE fuses the casts our runtime runs as
  separate passes);
- TP communication with sequence parallelism overlapped by userbuffers (--tp-comm-overlap): all of it that the
  GEMMs beside it can cover is hidden (`tp_hidden_fraction` 1, stated: MEGATRON_TP_HIDDEN_FRACTION; the profile's
  fraction is our runtime's);
  without it, the backward's asynchronous column-parallel collectives still hide behind its GEMMs at that fraction
  (`tp_backward_beside_gemms`) and the rest is exposed;
- DP overlap with the distributed optimizer (--overlap-grad-reduce / --overlap-param-gather) by its mechanism
  (planner/cost/terms.bucketed_exposed_s): buckets of max(`dp_bucket_params`, 1M x DP) parameters (Megatron's
  default), at least one per model chunk, in the order backward produces their gradients; each bucket's
  reduce-scatter starts when its last gradient is ready, after the chunk's last micro-batch, and overlaps the
  backward left after it; the parameter all-gather mirrors it over the next step's first forward. What the
  communication leaves beyond that compute is exposed (at least the last bucket's tail). One fitted factor,
  `dp_overlap_contention`, is the share of the overlapped time the compute still loses (SM and memory contention);
- MoE all-to-alls: one dispatch per layer (no two-chunk dispatch of ours), exposed (`ep_hidden_without_overlap` 0:
  the alltoall dispatcher runs them in order with the experts), or with Megatron-Core's batch-level EP overlap
  (`ep_a2a_beside_layer`; the plan's Layout.overlap_ep, which the search picks where it pays and `plan export`
  writes as --overlap-moe-expert-parallel-comm --delay-wgrad-compute) beside the other micro-batch's whole layer,
  `ep_hidden_fraction` of each window hidden (fitted);
- its MoE layer (router, TE's fused permutes, GroupedLinear experts, their activation) at `expert_factor` times
  ours on top of `compute_factor` (fitted on the MoE fit rows);
- its pipeline schedules (1F1B, interleaved 1F1B): the same schedule play as ours (planner/schedule.py);
- eager execution (no CUDA graph): the host issues each layer's kernels, `host_layer_s` per layer and micro-batch
  (forward and backward, a stated figure, `host_factor` 1); a stage runs at the slower of the GPU and the host.

The megatron factors live in profiles/targets/megatron.json with their provenance (written by
benchmarks/fit_megatron_target.py from the `fit` rows of benchmarks/published/runs.csv only). They are relative
to this project's kernels and apply on any GPU kind, so they are a file of their own, not part of a GPU's profile.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from planner.errors import PlanError, read_json
from planner.memory import Fp8ActivationCache, StateStorage
from planner.plan import RUNTIME_TARGETS

MEGATRON_HOST_LAYER_S = 0.6e-3
"""Stated figure: host time for Megatron-Core (TE layers, eager PyTorch) to issue one transformer layer's forward
and backward for one micro-batch, about 0.25 ms forward and 0.35 ms backward (autograd) of Python and kernel-launch
work for the ~100 kernels of a TE layer. An estimate, not measured here: `host_factor` scales it."""

MEGATRON_TP_HIDDEN_FRACTION = 1.0
"""Share of the TP communication userbuffers can hide behind the GEMMs beside it: all of it up to their time. Stated
(the fit of this share settled at its bound of 1 on the fit rows, so it is no longer a free factor)."""

MEGATRON_DP_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's default DDP bucket size (--ddp-bucket-size unset: max(40M, 1M x DP size) parameters)."""


@dataclass(frozen=True)
class RuntimeTarget:
    name: str
    compute_factor: float = 1.0
    """The runtime's kernels' GPU time over ours (GEMMs, attention, elementwise), per layer and at the ends."""
    tp_hidden_fraction: float | None = None
    """Share of the TP communication an overlapped step can hide; None: the profile's (our runtime's)."""
    dp_hidden_fraction: float | None = None
    """Share of the DP communication an overlapped step can hide; None: the profile's."""
    ep_hidden_fraction: float | None = None
    """Share of the MoE all-to-alls hidden behind the expert compute beside them (Megatron-Core's EP overlap,
    --overlap-moe-expert-parallel-comm, and its permute fusion); None: the profile's."""
    dp_bucket_params: float = 0.0
    """Parameters per DP bucket (at least, see dp_bucket_params_per_dp_rank); 0: no bucket mechanism, the plain
    overlap rule at dp_hidden_fraction or the profile's fraction."""
    dp_bucket_params_per_dp_rank: float = 1e6
    """A bucket holds at least this many parameters per DP rank (Megatron-Core: max(40M, 1M x DP)); 0: buckets of
    dp_bucket_params whatever the DP size (ours, runtime/parallel/flat_buffer.py)."""
    dp_overlap_contention: float | None = 0.0
    """Share of a DP collective's overlapped time that the compute beside it loses (bucketed_exposed_s); None: one
    less the profile's DP overlap fraction, which `plan calibrate` fits on measured runs of our runtime."""
    host_layer_s: float = 0.0
    """Host time per layer and micro-batch (forward + backward); 0: the profile's host model (ours)."""
    host_factor: float = 1.0
    """Scales host_layer_s (fitted)."""
    expert_factor: float = 1.0
    """The runtime's MoE layer kernels (router, permutes, grouped expert GEMMs, their activation) over ours, on top of
    compute_factor. Megatron-Core runs the experts through Transformer Engine's GroupedLinear, its fused permutes and
    its router where ours runs torch._grouped_mm (runtime/parallel/expert_mlp.py); in FP8 layouts it also absorbs
    how far the FP8 grouped GEMMs run from the bf16 grouped-over-dense ratio they are priced at (fp8_experts).
    Fitted on the MoE fit rows; 1: ours."""
    legacy_compute_factor: float = 1.0
    """compute_factor of the Megatron-LM that Narayanan et al. 2021 and Korthikanti et al. 2022 ran (A100, fp16 /
    bf16, apex's fused kernels, no Transformer Engine; their published rows, benchmarks/published_rows.
    LEGACY_MEGATRON_SOURCES): fitted apart so that those rows do not set the factor of the current Megatron-Core.
    Plans never read it; the published check prices those rows with it."""
    fp8_gemm_factor: float = 1.0
    """The runtime's FP8 GEMM time over the profile's FP8 GEMMs (ours quantises both operands per call with current
    scaling, runtime/parallel/fp8.py; TE's delayed scaling fuses the casts into the kernels before)."""
    ep_a2a_beside_layer: bool = False
    """Whether the one MoE dispatch's all-to-alls run beside the other micro-batch's whole layer (Megatron-Core's
    batch-level EP A2A overlap, --overlap-moe-expert-parallel-comm --delay-wgrad-compute; Megatron-Bridge's
    moe_a2a_overlap): the combined 1F1B schedule runs one micro-batch's layer forward beside another's backward on
    two streams, "comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd" beside "comp_stream:
    pre_dispatch_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | pre_dispatch_bwd" (Megatron-LM
    megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run). Priced by planner/cost/terms.ep_beside_layer_exposed_s at ep_hidden_fraction
    per window, where the layout admits the schedule (no pipeline or an interleaved one: TransformerConfig asserts a
    virtual pipeline size when PP > 1) and the plan turns it on (Layout.overlap_ep: the search picks it where it
    pays; `plan export --to megatron` writes the two flags); False: the all-to-alls hide behind the experts only (a
    quarter of the layer's expert compute each). Megatron's target can (megatron_target); a published row that ran
    without it is planned without (benchmarks/published_rows.row_target). A trait, not a fitted factor."""
    ep_hidden_without_overlap: float | None = None
    """Share of the all-to-alls hidden behind the experts when the layer's dispatch is not overlapped (Layout.
    overlap_ep off, or the schedule does not admit it); None: ep_hidden_fraction. Megatron: 0, since its alltoall
    dispatcher runs router, permute, dispatch, experts, combine and unpermute in order on one stream
    (megatron/core/transformer/moe/moe_layer.py, MoELayer.forward); the fitted fraction is the batch-level overlap's."""
    two_chunk_dispatch: bool = True
    """Whether MoE tokens may be dispatched in two overlapped chunks (Layout.overlap_ep; ours); else one dispatch
    whose all-to-alls hide behind the experts at ep_hidden_fraction."""
    fp8_wgrad: bool = False
    """Weight-gradient GEMMs in FP8 too when the layout is FP8."""
    fp8_experts: bool = False
    """Whether the MoE experts' grouped GEMMs run in FP8 too when the layout is FP8 (Transformer Engine's GroupedLinear
    under the FP8 recipe; DeepSeek-V3's FP8 framework, arXiv 2412.19437 Figure 6); priced as the FP8 dense GEMM of
    all their rows at the measured bf16 grouped-over-dense ratio (Profile.grouped_gemm_s), times fp8_gemm_factor:
    modelled. torch's own FP8 grouped kernel measured 1.34-1.61x its dense FP8 GEMM at DeepSeek-V3's and
    Qwen3-235B's expert shapes where bf16's is 0.95-1.41x (benchmarks/results/fp8-grouped-gemm/), so for a
    runtime on that kernel this is 1.3-1.5x fast; TE's and DeepSeek's kernels are not measured.
    False: ours, whose grouped experts (torch._grouped_mm) run in bf16."""
    tp_backward_beside_gemms: bool = False
    """Whether, with the TP overlap off (Layout.overlap_tp False), the backward's column-parallel collectives still
    run beside its GEMMs: Megatron-LM's LinearWithGradAccumulationAndAsyncCommunication issues the re-gather of the
    sequence-parallel input asynchronously beside the input-gradient GEMM and the input gradient's reduce-scatter
    (all-reduce without sequence parallelism) beside the weight-gradient GEMM (in every Megatron-LM version the
    published rows ran, Korthikanti et al.'s included); the forward's collectives and the backward's gather of the output gradient stay on
    the critical path. Korthikanti et al. 2022 (arXiv 2205.05198) section 6.2: full recompute costs 39% rather than
    33% "due to an optimization in the backward pass where we overlap all-reduce communication with the linear
    weight's gradient computation". False: every TP collective is exposed when the overlap is off (ours)."""
    expert_states_over_tp: bool = False
    """Whether the distributed optimizer shards the experts' states over the TP ranks too (memory.expert_shard_ranks):
    Megatron-Core with expert tensor parallel 1 (the Megatron-Bridge MoE configs' etp 1) lays its expert-parallel
    and expert-data-parallel groups over TP x DP x CP, expert_data_parallel_size = world / (ETP x EP x PP)
    (megatron/core/parallel_state.py, initialize_model_parallel), and shards the experts' buffers
    over that group (megatron/core/distributed/distributed_data_parallel.py, intra_expt_dp_group). The same layout
    makes an EP group consecutive ranks (stride 1, planner/cost/comm.py strides), where ours spaces it by TP.
    False: ours, whose TP peers each keep a rank's experts and their optimizer states whole."""
    ep_dispatch_per_node: bool = False
    """Whether the MoE dispatch sends each token once per destination node over the network and fans it out to
    that node's GPUs over NVLink (DeepEP's internode normal kernels, Megatron-Core's flex dispatcher with
    moe_enable_deepep; DeepSeek-V3's own kernels, arXiv 2412.19437 section 3.2.2: "it will first be transmitted via
    IB to the GPUs with the same in-node index on its target nodes", then "forwarded via NVLink"). Priced by
    planner/cost/moe_layer.py MoeTerms._ep_all_to_all_s. False: a plain NCCL all-to-all of every routed token copy
    (Megatron's alltoall dispatcher; ours). A trait of the run, set per published row (benchmarks/published_rows.
    row_target, runs.csv column `ep_dispatch`)."""
    ep_route_groups: int = 0
    """The router's expert groups (group-limited routing; DeepSeek-V3: 8, its config's n_group); 0: none. Only read
    with ep_dispatch_per_node."""
    ep_group_limit: int = 0
    """Most groups one token's experts come from (DeepSeek-V3: 4, topk_group; at EP 64 over 8 nodes a group is a
    node's experts, hence "each token ... dispatched to at most 4 nodes", arXiv 2412.19437 section 3.2.2); 0: no
    limit. The node cap this gives: planner/cost/moe_layer.py dispatch_remote_nodes."""
    cp_hidden_fraction: float | None = None
    """Share of the context-parallel K/V traffic hidden behind the attention blocks beside it; None: the profile's
    (our ring's). Llama 3's all-gather CP: 0 (arXiv 2407.21783 section 3.3.2, "the all-gather communication latency
    is exposed in the critical path")."""
    cp_kv_expanded: bool = False
    """Whether K and V reach the context-parallel exchange already expanded to the query heads (torchtitan, at the
    version of its published benchmarks in docs/performance.md, repeats the KV heads before F.scaled_dot_product_attention, torchtitan/models/llama/model.py, so its CP moves
    heads / kv_heads times the bytes); False: K and V travel with their own heads (ours, Megatron's)."""
    cp_kv_all_gather: bool = False
    """Whether the forward gathers every rank's K and V in one all-gather issued beside the first (local) block,
    the rest of the ring's blocks waiting for it (PyTorch's experimental context_parallel with its default
    rotate method 'allgather', torch 2.6 torch/distributed/tensor/experimental/_attention.py, _AllGatherRotater);
    the backward gathers them again the same way and passes dK, dV around the ring beside the blocks. False: K and V
    pass around the ring one step beside each block (ours, Megatron's)."""
    cp_fp32_buffers: bool = False
    """Whether the context-parallel attention keeps its running output and its dQ, dK, dV in fp32 and passes dK, dV
    around the ring in fp32 through every rank, the last step waited at once, as PyTorch's context_parallel did in
    torch 2.6 (torch/distributed/tensor/experimental/_attention.py: _SDPAMerger with convert_to_f32 on by default,
    _templated_ring_attention_backward's fp32 buffers and its dK/dV rotater); its merges, casts and concatenations
    are priced as memory-bound passes (planner/cost/layer.py torch_cp_fp32_pass_bytes). False: ours, Megatron's."""
    cp_dkv_fp32: bool = False
    """Whether the ring attention's backward passes dK, dV around the ring in fp32 through every rank (cp steps of
    twice K and V's bf16 bytes, the last waited at once) while its K, V passes and its attention blocks stay as
    the profile measured them: ours (runtime/parallel/context.py accumulates dK, dV in fp32 and sends the
    accumulator). cp_fp32_buffers implies it (dkv_ring_fp32)."""
    qkv_output_gather: bool = False
    """How the runtime runs fewer KV heads (query groups) than TP ranks (planner/legality.py admits KV heads that
    divide TP). True: the fused QKV GEMM stays column-parallel over (q + 2 kv) / TP output columns, its output is
    all-gathered across TP (its gradient reduce-scattered in backward, on the critical path) and each rank slices
    its group's K, V and its own query heads: Megatron-Core's QKV activation sub-sharding
    (megatron/core/transformer/attention.py, since core_v0.16.0, NVIDIA/Megatron-LM f7dfb99795), whose
    TransformerConfig accepts query groups that are a multiple or a divisor of TP. False: each rank computes the K
    and V of the head it shares from replicated weights, whose gradients are summed over TP (ours,
    runtime/parallel/tensor.py SharedKVQKVLinear); no extra collective. Memory counts the replicated K/V weights
    either way (2 x kv_width x hidden per layer, under 1% of a layer where KV heads are fewer than TP)."""
    cp_output_copy: bool = False
    """Whether the context-parallel attention's output, [b, heads, s, d] as the ring writes it and kept for its
    backward, is copied to [s, b, heads * d] for the output projection, which keeps the copy: one more attention
    output per layer without recompute (ours, runtime/parallel/context.py; memory.layer_activations)."""
    attention_fwd_factor: float = 1.0
    """The runtime's attention kernel's forward time over the profile's (the runtime's SDPA, cuDNN's fused attention
    on Hopper). A run that used another kernel is priced at its measured ratio: FlashAttention-2, which torch's SDPA
    picked on H100 from 2.5.1 to 2.8 and PyTorch's context parallel ran until 2025, at profiles/targets/
    attention-fa2.json (measured by benchmarks/attention_backends.py; `attention_fa2`). 1: the profile's kernel."""
    attention_bwd_factor: float = 1.0
    """The same for the attention backward."""
    unfused_attention: bool = False
    """Whether the runtime runs the attention core unfused, as the Megatron-LM of 2021 and 2022 did (before
    FlashAttention): the whole s x s scores by a batched GEMM, a fused causal softmax, dropout, a second batched
    GEMM, each pass through memory (planner/cost/layer.py LayerTerms._unfused_attention_s), and without recompute their softmax output,
    dropout mask and dropout output kept for backward (planner.memory.unfused_core_layer_activations). False: a
    fused kernel (ours, Megatron-Core with Transformer Engine)."""
    eager_llama_elementwise: bool = False
    """Whether the layer's elementwise work (RMSNorms, rotary, repeat_kv, SwiGLU, residual adds, the gradient
    accumulations of tensors read twice) runs as the eager PyTorch ops of torchtitan's Llama 3 model without
    torch.compile, each its own memory-bound kernel with RMSNorm's and rotary's fp32 upcasts, and autograd's kernels
    for their backward (planner/cost/eager_ops.py counts each kernel's bytes and eager_llama_elementwise_s prices
    each at the profile's memory-bound rate with one launch), as torchtitan (9dec370, torchtitan/models/llama/
    model.py, torchtitan/models/norms.py) runs without torch.compile; under it, Inductor fuses them into kernels
    that move about what our fused kernels move. The selective recompute term is what torchtitan's op-level SAC
    (torchtitan/parallelisms/parallelize_llama.py: SDPA and every other mm saved, the rest rerun up to the last saved
    tensor) reruns of them: every forward elementwise kernel but the last residual add; the GEMMs it reruns and the
    attention it keeps are not this field's (the selective term still prices the attention core's rerun). Only a
    dense Llama layer (RMSNorm, SwiGLU, rotary, no biases or q/k norms) has this form. False: the runtime's fused
    kernels at the profile's measured rates (ours, Megatron's TE kernels, torchtitan under torch.compile)."""
    dual_pipe: bool = False
    """Whether the pipeline runs DeepSeek-V3's DualPipe (arXiv 2412.19437 section 3.2.1, Figure 5, Table 2) where the
    layout admits it (an even PP of at least 2, no interleaving, an even number of at least PP micro-batches;
    CostModel.dual_pipe): micro-batches enter from both ends, rank r holds stage r and stage PP-1-r ("2x"
    parameters), each rank's chunks hold PP - r and r + 1 micro-batches at the peak ("PP+1" activations), the bubble
    is (PP/2 - 1)(F&B + B - 3W), and a forward chunk runs beside another micro-batch's backward chunk so that "both
    all-to-all and PP communication can be fully hidden" (the MoE all-to-alls priced as beside the other
    micro-batch's layer, ep_a2a_beside_layer's rule; hops free). False: the 1F1B schedules of planner/schedule.py."""
    fp8_activation_cache: Fp8ActivationCache | None = None
    """How the runtime stores activations for backward when not as ours: DeepSeek-V3's FP8 cache with recomputed
    norms, MLA up-projections and SwiGLU outputs (planner.memory.Fp8ActivationCache, fp8_cached_layer_activations).
    None: as our runtime keeps them (planner.memory.layer_activations). The recomputed norms and up-projections are
    not priced as time (the report calls their overhead minimal)."""
    state_storage: StateStorage | None = None
    """How the runtime's optimizer keeps weights, gradients and its states under 'optimizer' sharding when not as ours
    (planner.memory.StateStorage): e.g. Apex's DistributedFusedAdam as NeMo 1.x ran it, with bf16 master weights and
    moments and FP8 parameters. None: as our runtime keeps them (planner.memory.state_parts_per_param)."""
    cuda_graph: bool = True
    """Whether the runtime can capture the step as a CUDA graph (ours can where legal; Megatron is run eagerly)."""
    provenance: dict = field(default_factory=dict, compare=False, hash=False)

    # -- the named terms ----------------------------------------------------------------------------------
    def kernel_s(self, ours_s: float) -> float:
        """GPU time of kernels that take `ours_s` in our runtime."""
        return ours_s * self.compute_factor

    def attention_s(self, ours_s: float, backward: bool) -> float:
        """The runtime's attention kernel that takes `ours_s` as the profile measured it."""
        return ours_s * (self.attention_bwd_factor if backward else self.attention_fwd_factor)

    def gemm_s(self, table: str, ours_s: float) -> float:
        """A GEMM from the profile's `table` ('mm', 'wgrad', 'fp8') that takes `ours_s` in our runtime."""
        return ours_s * self.fp8_gemm_factor if table == "fp8" else ours_s

    @property
    def dkv_ring_fp32(self) -> bool:
        """Whether dK, dV travel the ring in fp32 through every rank (cp_fp32_buffers or cp_dkv_fp32): the one rule
        for the bytes of the context-parallel backward (planner/cost/layer.py _cp_comm_s and the simulation's
        runtime/simulate/predict.py)."""
        return self.cp_fp32_buffers or self.cp_dkv_fp32

    def tp_fraction(self, profile_fraction: float) -> float:
        return profile_fraction if self.tp_hidden_fraction is None else self.tp_hidden_fraction

    def cp_fraction(self, profile_fraction: float) -> float:
        return profile_fraction if self.cp_hidden_fraction is None else self.cp_hidden_fraction

    def ep_fraction(self, profile_fraction: float) -> float:
        return profile_fraction if self.ep_hidden_fraction is None else self.ep_hidden_fraction

    def dp_fraction(self, profile_fraction: float) -> float:
        return profile_fraction if self.dp_hidden_fraction is None else self.dp_hidden_fraction

    def dp_exposed_s(self, comm_s: float, params: float, beside_s: float, profile_fraction: float,
                     overlap: bool, dp: int = 1, chunks: int = 1) -> float:
        """Exposed DP traffic `comm_s` of `params` parameters beside `beside_s` of compute (one micro-batch's
        backward of the rank's layers for the gradient reduction, its forward for the parameter gather): without a
        bucket size the overlap rule (planner/cost/terms.exposed_s) at this target's fraction; with one, the bucket
        mechanism (terms.bucketed_exposed_s) over max(bucket, 1M x dp)-parameter buckets, at least one per model
        chunk (`chunks`: virtual stages per rank)."""
        from planner.cost.terms import bucketed_exposed_s, exposed_s

        if not overlap or self.dp_bucket_params <= 0 or params <= 0:
            return exposed_s(comm_s, beside_s, self.dp_fraction(profile_fraction), overlap)
        bucket = max(self.dp_bucket_params, self.dp_bucket_params_per_dp_rank * dp)
        buckets = max(chunks, math.ceil(params / bucket))
        return bucketed_exposed_s(comm_s, beside_s, buckets, self.dp_contention(profile_fraction))

    def dp_contention(self, profile_fraction: float) -> float:
        """The bucket mechanism's one factor (dp_overlap_contention, or one less the profile's DP fraction)."""
        if self.dp_overlap_contention is not None:
            return self.dp_overlap_contention
        return 1.0 - self.dp_fraction(profile_fraction)

    def stage_host_s(self, layers: float, recompute_layers: float) -> float:
        """Host time to issue one micro-batch of a stage of `layers` layers, `recompute_layers` of them rerunning
        their forward in backward (a forward's host time, about 40% of a layer's, once more)."""
        return self.host_layer_s * self.host_factor * (layers + 0.4 * recompute_layers)

    @property
    def own_host_model(self) -> bool:
        return self.host_layer_s > 0

    def describe(self) -> str:
        """One line naming the target, for every report."""
        if self.name == "ours":
            return "ours (this project's runtime)"
        fitted = self.provenance.get("fitted_on", "")
        return (f"megatron (Megatron-Core + Transformer Engine, eager; compute x{self.compute_factor:.3f}, TP overlap "
                f"hides {self.tp_hidden_fraction:.0%}, DP buckets of {self.dp_bucket_params / 1e6:.0f}M parameters "
                f"overlapped at {self.dp_overlap_contention:.0%} contention, FP8 GEMMs x{self.fp8_gemm_factor:.2f}, MoE layer kernels x{self.expert_factor:.2f}, batch-level EP overlap hides {self.ep_hidden_fraction:.0%} (without it none), host {self.host_layer_s * self.host_factor * 1e3:.2f}"
                f" ms per layer and micro-batch" + (f"; fitted on {fitted}" if fitted else "") + ")")


OURS_DP_BUCKET_PARAMS = 40e6
"""Our distributed optimizer's gradient bucket (runtime/parallel/distributed_optimizer.py bucket_elems): each
bucket's reduction is launched as soon as backward has filled it."""

OURS = RuntimeTarget("ours", cp_dkv_fp32=True, cp_output_copy=True, dp_bucket_params=OURS_DP_BUCKET_PARAMS, dp_bucket_params_per_dp_rank=0.0,
                     dp_overlap_contention=None)

TARGETS_DIR = "targets"


def target_file(name: str) -> Path:
    return Path(str(resources.files("profiles"))) / TARGETS_DIR / f"{name}.json"


MEGATRON_FACTORS = ("compute_factor", "dp_overlap_contention", "ep_hidden_fraction", "fp8_gemm_factor", "expert_factor",
                    "legacy_compute_factor")
"""The megatron target's free factors (fitted by benchmarks/fit_megatron_target.py)."""


def megatron_target(factors: dict, dp_bucket_params: float = MEGATRON_DP_BUCKET_PARAMS,
                    host_layer_s: float = MEGATRON_HOST_LAYER_S, provenance: dict | None = None) -> RuntimeTarget:
    """The megatron RuntimeTarget with these free factors (MEGATRON_FACTORS) and its fixed traits: one MoE dispatch
    per layer, FP8 weight gradients and experts, eager execution, the experts' states sharded over TP x DP x CP / EP (ETP 1)."""
    return RuntimeTarget("megatron", **{k: float(factors[k]) for k in MEGATRON_FACTORS},
                         tp_hidden_fraction=MEGATRON_TP_HIDDEN_FRACTION, qkv_output_gather=True,
                         dp_bucket_params=float(dp_bucket_params), host_layer_s=float(host_layer_s),
                         two_chunk_dispatch=False, fp8_wgrad=True, fp8_experts=True, cuda_graph=False,
                         tp_backward_beside_gemms=True,
                         ep_a2a_beside_layer=True, ep_hidden_without_overlap=0.0, expert_states_over_tp=True,
                         provenance=dict(provenance or {}))


def megatron_from_dict(d: dict, source: str) -> RuntimeTarget:
    try:
        return megatron_target(d["factors"], d.get("dp_bucket_params", MEGATRON_DP_BUCKET_PARAMS),
                               d.get("host_layer_s", MEGATRON_HOST_LAYER_S), d.get("provenance") or {})
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{source} is not a valid runtime-target file ({exc.__class__.__name__}: {exc})") from None


_LOADED: dict[str, RuntimeTarget] = {}

FA2_FILE = "attention-fa2"
_FA2_RATIOS: list[float] = []
"""The shipped file's (forward, backward) ratios once read."""


def attention_fa2(target: RuntimeTarget, path: Path | None = None) -> RuntimeTarget:
    """`target` with its attention kernel priced as FlashAttention-2: the profile's attention times the measured
    FA2-over-runtime ratios of profiles/targets/attention-fa2.json (or `path`)."""
    from dataclasses import replace

    p = Path(path) if path is not None else target_file(FA2_FILE)
    if path is None and _FA2_RATIOS:
        return replace(target, attention_fwd_factor=_FA2_RATIOS[0], attention_bwd_factor=_FA2_RATIOS[1])
    try:
        d = read_json(p, "attention-ratio file", f"the FlashAttention-2 ratios are missing ({p}); run "
                      "benchmarks/attention_backends.py")
        fwd, bwd = float(d["fa2_over_runtime_fwd"]), float(d["fa2_over_runtime_bwd"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{p} is not a valid attention-ratio file ({exc.__class__.__name__}: {exc})") from None
    if not (0.2 <= fwd <= 10 and 0.2 <= bwd <= 10):
        raise PlanError(f"{p}: FA2 ratios {fwd}, {bwd} are outside 0.2-10, not a measured kernel ratio")
    if path is None:  # read once (the published check asks for it per row)
        _FA2_RATIOS[:] = [fwd, bwd]
    return replace(target, attention_fwd_factor=fwd, attention_bwd_factor=bwd)


def load_target(name: str, path: Path | None = None) -> RuntimeTarget:
    """The RuntimeTarget called `name` ('ours', or 'megatron' from its factors file, `path` or the shipped one)."""
    if name == "ours":
        return OURS
    if name != "megatron":
        raise PlanError(f"unknown runtime target '{name}'; known: {', '.join(RUNTIME_TARGETS)}")
    if path is None and name in _LOADED:
        return _LOADED[name]
    p = Path(path) if path is not None else target_file(name)
    d = read_json(p, f"factors file of runtime target '{name}'", f"the factors of runtime target '{name}' are "
                  f"missing ({p}); run benchmarks/fit_megatron_target.py")
    t = megatron_from_dict(d, str(p))
    if path is None:
        _LOADED[name] = t
    return t
