"""Activations per layer and micro-batch on one rank, as the runtime saves them for backward (by recompute mode),
the transient working set of a layer's backward, and the per-micro-batch tensors of the pipeline's ends: the
activation part of the memory model (planner/memory/model.py counts the parameters' states and buffers).

Per layer, Korthikanti et al. 2022 with flash attention (no s^2 score matrix) and no dropout, as the runtime saves
them with tensor parallelism t and sequence parallelism: norm inputs, GEMM inputs (kept sequence-sharded and
re-gathered in backward), q/k/v, the attention output and its log-sum-exp, the MLP activation's input and output
(with Qwen3's q/k norms also the qkv GEMM output and their rstd). Selective recompute drops the norm outputs, the
MLP activation output and the q/k norms' tensors; full recompute keeps only the layer input. Other runtimes'
storage where a target says so: DeepSeek-V3's FP8 cache (Fp8ActivationCache), 2021-22 Megatron-LM's unfused
attention core (unfused_core_layer_activations).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.memory.model import BF16_BYTES, FP32_BYTES
from planner.model import ModelSpec
from planner.plan import Layout, TrainingShape


@dataclass(frozen=True)
class LayerActivations:
    none_bytes: float
    selective_bytes: float
    full_bytes: float
    working_bytes: float
    """Transient working set while one layer runs backward (its gradients and, under full recompute,
    its rematerialised activations)."""


@dataclass(frozen=True)
class Fp8ActivationCache:
    """DeepSeek-V3's activation storage (arXiv 2412.19437): "We recompute all RMSNorm operations and MLA
    up-projections during back-propagation" (section 3.2.3); "it is a natural choice to cache activations in FP8
    format for the backward pass of the Linear operator", the inputs of the Linear after attention in a 12-bit
    E5M6 format, and "we cache the inputs of the SwiGLU operator and recompute its output in the backward pass",
    in FP8; the activation before the MoE up-projections is quantized to FP8 before the dispatch (section 3.3.3).
    A run that stored its activations so is planned with these rules (fp8_cached_layer_activations) in place of
    our runtime's."""
    mla_latent_width: int = 0
    """Elements per token that stand for q, k and v when the up-projections are recomputed: MLA's compressed query
    and key-value and the rope key (DeepSeek-V3's config: q_lora_rank 1536 + kv_lora_rank 512 + qk_rope_head_dim
    64), kept in bf16 as the down-projections wrote them (their norms are recomputed). 0: the model has no latent
    attention, and its q, k and v are kept in bf16 as ours keeps them."""


E5M6_BYTES = 1.5
"""DeepSeek-V3's 12-bit format for the attention output (the input of the Linear after attention)."""
FP8_BYTES = 1


def fp8_cached_layer_activations(m: ModelSpec, shape: TrainingShape, lay: Layout,
                                 cache: Fp8ActivationCache) -> LayerActivations:
    """Activations per layer and micro-batch on one rank when stored by `cache`'s rules. Kept: each norm's input
    (bf16; the norm and its statistics are recomputed), the MLA latents or q/k/v, the attention output in E5M6
    with its fp32 log-sum-exp, the router's fp32 logits and probabilities (as ours); per routed token copy the
    received FP8 expert input (the up-projection's cached input), the SwiGLU's FP8 input (its output is
    recomputed) and the bf16 expert output that the combine's gradient of the routing weights needs; per token the
    shared experts' FP8 SwiGLU input. Their Linear inputs that are norm outputs are recomputed with the norms.
    Selective recompute has nothing left to drop; full recompute keeps the layer input, as ours."""
    ours = layer_activations(m, shape, lay)
    t = lay.tp
    tokens = lay.micro_batch * shape.seq_len / lay.cp
    tok_t = tokens / t
    h, f = m.hidden, m.ffn_hidden
    norms_in = 2 * BF16_BYTES * h * tok_t
    qkv = BF16_BYTES * (cache.mla_latent_width * tok_t if cache.mla_latent_width else m.qkv_width_local(t) * tokens)
    attn_out = E5M6_BYTES * m.q_width * tok_t + FP32_BYTES * lay.micro_batch * (m.num_heads / t) * shape.seq_len / lay.cp
    if m.is_moe:
        router = FP32_BYTES * (2 * m.num_experts + 2 * m.top_k * m.num_experts) * tok_t
        up_in = (2 if m.gated_mlp else 1) * f
        routed = tok_t * m.top_k * (FP8_BYTES * (h + up_in) + BF16_BYTES * h)
        shared = FP8_BYTES * 2 * m.shared_expert_ffn * tok_t
        mlp = router + routed + shared
    else:  # the MLP's FP8 activation input, its output recomputed
        mlp = FP8_BYTES * (2 if m.gated_mlp else 1) * f / t * tokens
    none = norms_in + qkv + attn_out + mlp
    return LayerActivations(none, none, ours.full_bytes, ours.working_bytes)


def layer_activations(m: ModelSpec, shape: TrainingShape, lay: Layout, ring_output_copy: bool = False) -> LayerActivations:
    """Bytes one layer keeps per micro-batch on one rank, by recompute mode (our runtime's layers).
    `ring_output_copy`: the context-parallel attention keeps its output for its backward and the output projection
    keeps a reshaped copy (RuntimeTarget.cp_output_copy); selective recompute reruns the attention core, which
    drops the first."""
    t = lay.tp
    tokens = lay.micro_batch * shape.seq_len / lay.cp  # tokens of one micro-batch on this rank
    tok_t = tokens / t  # sequence-parallel share
    h, f = m.hidden, m.ffn_hidden
    a = BF16_BYTES
    stats = FP32_BYTES * (2 if m.layernorm else 1)  # LayerNorm keeps mean and rstd, RMSNorm only rstd
    norms_in = 2 * (a * h + stats) * tok_t
    gemm_in = 2 * a * h * tok_t  # QKV and FC1 inputs (the norm outputs), sequence-sharded
    qkv = a * m.qkv_width_local(t) * tokens  # each rank's heads' q, k, v over the whole sequence
    attn_out = a * m.q_width * tok_t + FP32_BYTES * lay.micro_batch * (m.num_heads / t) * shape.seq_len / lay.cp
    ring_copy = a * m.q_width * tok_t if ring_output_copy else 0.0
    # q/k norms (qk_norm): they keep the whole qkv GEMM output (v's part too: runtime/qk_norm.py saves it, PyTorch's
    # path keeps views into it) with an fp32 rstd per head and token; selective recompute reruns them inside the
    # checkpointed attention core, whose kept input is that same GEMM output
    qk_norms = (a * m.qkv_width_local(t) + FP32_BYTES * (m.num_heads / t + m.kv_heads_local(t))) * tokens \
        if m.qk_norm else 0.0
    if m.is_moe:
        # as runtime/parallel/expert.py keeps them: the router's fp32 probabilities (the softmax keeps its output;
        # the logits go, and the input _RouterLogits saves is the MoE norm's output, one of gemm_in's two) and the
        # routing's indices and weights (routing_bytes_per_copy); per routed token copy the expert input (the
        # gathered copy, or under EP the received one: the gather and the all-to-all save only indices,
        # runtime/parallel/expert_dispatch.py),
        # the SwiGLU's input (gate and up) and its product (runtime/swiglu.py keeps only its input), or
        # GELU's input and output, and the expert output that the weighted combine keeps (once: its
        # gather-and-sum keeps no second copy, as index_add did). The MoE layer keeps all of this under
        # selective recompute too. (checked against runtime.memory.saved_bytes_per_token in
        # tests/runtime/test_memory_model.py)
        routed = tok_t * m.top_k  # token copies this rank's experts see, on average
        router = tok_t * FP32_BYTES * m.num_experts + routed * routing_bytes_per_copy(lay.ep)
        expert_width = (3 if m.gated_mlp else 2) * f + 2 * h
        mlp = router + a * expert_width * routed
        # shared experts on every token (their input is the router's): the SwiGLU's input and product, and under
        # Qwen's gate its output (kept by the scaling) and the gate itself
        mlp += a * tok_t * (3 * m.shared_expert_ffn + ((h + 1) if m.shared_expert_gate else 0))
        act_out_total = 0.0
    elif m.gated_mlp:
        act_in = a * 2 * f / t * tokens
        act_out_total = a * f / t * tokens
        mlp = act_in + act_out_total
    else:
        act_in = a * f / t * tokens
        act_out_total = a * f / t * tokens
        mlp = act_in + act_out_total
    none = norms_in + gemm_in + qkv + qk_norms + attn_out + ring_copy + mlp
    # selective drops the norm outputs (GEMM inputs) and the activation output; the MoE layer applies its
    # norm itself and keeps the output, so there only the attention norm's output goes
    selective = none - (gemm_in / 2 if m.is_moe else gemm_in) - act_out_total - qk_norms - ring_copy
    full = a * h * tok_t
    widest = max(h, 0 if m.is_moe else (2 if m.gated_mlp else 1) * f, m.qkv_width_local(t) * t)
    working = 3 * a * widest * tokens / t
    if m.is_moe:
        working = max(working, moe_working_bytes(m, tok_t, lay.ep))
    return LayerActivations(none, selective, full, working)


ROUTING_BYTES_PER_COPY = 40
"""Bytes the MoE layer keeps per routed token copy for its routing (runtime/parallel/expert.py): top-k's fp32 value
and int64 index, the int64 sort order of the copies by expert, its inverse and the sorted token ids, and the
copies' fp32 combine weights."""
EP_ROUTING_BYTES_PER_COPY = 16
"""More under EP (runtime/parallel/expert_dispatch.py): the received rows' int64 regrouping order and its inverse."""
EP_DISPATCH_COPIES = 5
"""Routed-row-sized (hidden-wide, bf16) buffers an MoE layer's forward holds under EP beyond what it keeps
(runtime/parallel/expert_dispatch.py dispatch_compute_combine): the gathered rows it sends, the dispatch's receive
buffer, the combine's receive buffer, and of the last dispatch chunk its experts' output and its regathered copy:
3 + 2 / chunks routed sets, counted at one chunk (the most)."""


def routing_bytes_per_copy(ep: int) -> float:
    """ROUTING_BYTES_PER_COPY, with EP_ROUTING_BYTES_PER_COPY more under EP."""
    return ROUTING_BYTES_PER_COPY + (EP_ROUTING_BYTES_PER_COPY if ep > 1 else 0)


def moe_working_bytes(m: ModelSpec, tok_t: float, ep: int) -> float:
    """The largest transient of an MoE layer on `tok_t` tokens of one rank: in backward, an expert's gradients on
    its routed rows, the down projection's input gradient (f per row) beside the SwiGLU's input gradient (2f;
    GELU's: f), or that beside the up projection's input gradient (h); under EP the forward's dispatch buffers
    (EP_DISPATCH_COPIES routed rows of width h); the shared experts' backward on every token likewise. The
    simulation traces the first two (benchmarks/results/simulation/: Mixtral's peak in an expert's backward, the
    DeepSeek-V3-sized MoE's in a forward dispatch)."""
    a, h, f = BF16_BYTES, m.hidden, m.ffn_hidden
    routed = tok_t * m.top_k
    act_grad = 2 * f if m.gated_mlp else f
    expert = a * routed * max(f + act_grad, act_grad + h)
    dispatch = a * routed * h * EP_DISPATCH_COPIES if ep > 1 else 0.0
    fs = m.shared_expert_ffn
    shared = a * tok_t * max(3 * fs, 2 * fs + h) if fs else 0.0
    return max(expert, dispatch, shared)


UNFUSED_CORE_KEPT_BYTES = 5
"""Bytes per attention score an unfused attention core keeps for backward: the softmax output (2), the dropout mask
(1) and the dropout output (2); Korthikanti et al. 2022 (arXiv 2205.05198) equation 1's 5as/h term (5 a s^2 b
bytes per layer), the part its selective recompute drops."""
UNFUSED_CORE_WORKING_BYTES = 9
"""Bytes per score while an unfused core runs backward: the five kept (rematerialised under recompute) and the
gradients of the dropout output and of the scores (2 each) at once."""


def unfused_attention_score_elems(m: ModelSpec, shape: TrainingShape, lay: Layout) -> float:
    """Attention scores of one micro-batch on one rank when the core is unfused: every query row of this rank's
    heads against every key, the causal upper half included (the batched GEMM computes the whole square)."""
    return lay.micro_batch * (m.num_heads / lay.tp) * (shape.seq_len / lay.cp) * shape.seq_len


def unfused_core_layer_activations(m: ModelSpec, shape: TrainingShape, lay: Layout) -> LayerActivations:
    """The layer's activations (layer_activations, with a fused attention core) when the runtime runs the core
    unfused (RuntimeTarget.unfused_attention): without recompute it also keeps its scores' softmax output, dropout mask
    and dropout output (UNFUSED_CORE_KEPT_BYTES per score); selective recompute reruns the core and keeps none of
    them (as Korthikanti's selective recompute does); its backward's working set holds UNFUSED_CORE_WORKING_BYTES
    per score."""
    kept = layer_activations(m, shape, lay)
    e = unfused_attention_score_elems(m, shape, lay)
    return LayerActivations(kept.none_bytes + UNFUSED_CORE_KEPT_BYTES * e, kept.selective_bytes, kept.full_bytes,
                            kept.working_bytes + UNFUSED_CORE_WORKING_BYTES * e)


def head_activation_bytes(m: ModelSpec, shape: TrainingShape, lay: Layout) -> tuple[float, float]:
    """(kept per in-flight micro-batch, transient peak) on the stage holding the output layer and loss:
    final-norm input and output (with a head transform also its dense output and GELU output), and the
    cross-entropy's gradient of the logits, which
    runtime/parallel/cross_entropy.py computes in forward and keeps in the compute dtype; transiently the larger
    of the logits themselves while that gradient is written and the output layer's weight gradient while its
    backward runs: a weight-sized bf16 tensor, the gradient itself or, where the weight-gradient GEMM accumulates
    into the fp32 main gradient, the placeholder autograd passes on (runtime/parallel/tensor.py weight_grad)."""
    tokens = lay.micro_batch * shape.seq_len / lay.cp
    h, v = m.hidden, m.padded_vocab
    kept = 2 * BF16_BYTES * h * tokens / lay.tp + BF16_BYTES * v / lay.tp * tokens
    if m.model_family.head_transform:
        kept += 2 * BF16_BYTES * h * tokens / lay.tp
    transient = BF16_BYTES * v / lay.tp * max(tokens, h)
    return kept, transient


def embedding_activation_bytes(m: ModelSpec, shape: TrainingShape, lay: Layout) -> float:
    """Embedding backward needs only the token ids; an embedding norm (BERT's) keeps its input."""
    if not m.model_family.embedding_norm:
        return 0.0
    tokens = lay.micro_batch * shape.seq_len / lay.cp
    return BF16_BYTES * m.hidden * tokens / lay.tp


def pipeline_output_bytes(m: ModelSpec, shape: TrainingShape, lay: Layout) -> float:
    """A pipeline chunk keeps its output (sent to the next stage) until its backward, one per micro-batch
    in flight (runtime/parallel/pipeline.py keeps (input, output) per chunk and micro-batch)."""
    if lay.pp == 1:
        return 0.0
    return BF16_BYTES * m.hidden * lay.micro_batch * shape.seq_len / lay.cp / lay.tp


def rotary_table_bytes(m: ModelSpec, shape: TrainingShape, lay: Layout) -> float:
    """Rotary cos/sin tables (fp32, one row of head_dim per token of the micro-batch's sequence), built once
    per forward of a stage and kept by every layer's attention for backward: counted once per chunk and
    micro-batch in flight."""
    if m.learned_positions:
        return 0.0
    return FP32_BYTES * 2 * m.head_dim * lay.micro_batch * shape.seq_len / lay.cp


