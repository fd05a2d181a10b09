"""Memory per pipeline rank, counted in bytes from the tensors the runtime allocates.

Per parameter (mixed precision as the runtime runs it): a bf16 compute copy (2 B), an fp32 gradient
(4 B), an fp32 master copy (4 B) and Adam's two fp32 moments (8 B). Sharding over the data x context
ranks (d of them) divides: master + Adam by d for 'optimizer'; also gradients for 'optimizer+grads';
everything for 'full' (plus what FSDP2 gathers and reduces: planner/memory/fsdp.py). Expert weights are sharded
over the expert-data-parallel group (d / ep ranks) instead.

Activations per layer per micro-batch follow Korthikanti et al. 2022 with flash attention (no s^2 score
matrix) and no dropout, as the runtime saves them with tensor parallelism t and sequence parallelism:
norm inputs, GEMM inputs (kept sequence-sharded and re-gathered in backward), q/k/v, the attention
output and its log-sum-exp, the MLP activation's input and output (with Qwen3's q/k norms also the qkv GEMM
output and their rstd). Selective recompute drops the norm outputs, the MLP activation output and the q/k
norms' tensors; full recompute keeps only the layer input.

The allowance: the CUDA context, cuDNN and NCCL buffers live outside PyTorch's allocator (RESERVED_GIB;
cuBLAS workspaces are inside it and counted per rank, cublas_workspace_bytes), and the allocator fragments
(FRAGMENTATION): the planner only allows (capacity - RESERVED_GIB) * (1 - FRAGMENTATION) of predicted peak
allocated memory per GPU, and a plan keeps the cluster's headroom (5% of the GPU's memory by default) free below
that (plan_memory_limit_bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import ClusterSpec
from planner.model import ModelSpec
from planner.plan import Layout, TrainingShape
from planner.memory.in_flight import (in_flight_by_chunk, in_flight_micro_batches,  # noqa: F401 (re-exported)
                                      in_flight_peaks, peak_in_flight_bytes)

GIB = 2**30
BF16_BYTES = 2
FP32_BYTES = 4
RESERVED_GIB = 2.5
"""CUDA context (~0.6 GiB), cuDNN workspaces and NCCL communicator buffers, outside the allocator."""
FRAGMENTATION = 0.05
"""Share of the rest lost to the caching allocator's fragmentation."""
CUBLAS_WORKSPACE_BYTES = 32 * 2**20
"""One cuBLAS workspace: PyTorch's default on sm90 (CUBLAS_WORKSPACE_CONFIG :4096:8), one per (handle, stream)
that runs a GEMM, taken from the caching allocator (ATen's getNewWorkspace), so inside the measured peak,
unlike the CUDA context and NCCL buffers of RESERVED_GIB."""


def cublas_workspace_bytes(lay: Layout, gpu: str) -> float:
    """The cuBLAS workspaces a rank holds: two for an eager step, four for a CUDA-graph step (its warm-up side
    stream and its capture add two). Counted from measurement, not from PyTorch's code paths: the same plans peak
    60-70 MiB higher replayed than eager, and eager runs of small models 70-80 MiB above this model without the
    term (benchmarks/results/validation/). None on CPU."""
    if gpu == "cpu":
        return 0.0
    return (4 if lay.cuda_graph else 2) * CUBLAS_WORKSPACE_BYTES


def memory_limit_bytes(capacity_gib: float) -> float:
    """The allowance: what the planner lets a rank's predicted peak allocation reach on a GPU of this capacity."""
    return (capacity_gib - RESERVED_GIB) * (1 - FRAGMENTATION) * GIB


def plan_memory_limit_bytes(cluster: ClusterSpec) -> float:
    """The allowance less the cluster's headroom (ClusterSpec.headroom_gib): the most a plan's busiest rank may hold."""
    return memory_limit_bytes(cluster.kind.memory_gib) - cluster.headroom_gib * GIB


# -- parameters per rank (elements) --------------------------------------------------------------------
def layer_dense_params_local(m: ModelSpec, tp: int) -> float:
    """Non-expert parameters of one layer held by one tensor-parallel rank (norms and row biases replicated)."""
    h = m.hidden
    qkv_rows = m.qkv_weight_rows_local(tp)
    attn = h * qkv_rows + m.q_width * h / tp
    if m.has_qkv_bias:
        attn += qkv_rows
    if m.has_attn_out_bias:
        attn += h
    attn += m.qk_norm_params()  # whole on every rank: each holds its own heads' share of their gradient
    norms = 2 * m.norm_params()
    if m.is_moe:  # router and shared experts whole on every TP rank, like the routed experts
        return attn + norms + m.router_params() + m.shared_expert_params()
    return attn + norms + mlp_params_local(m, tp)


def mlp_params_local(m: ModelSpec, tp: int) -> float:
    h, f = m.hidden, m.ffn_hidden
    if m.gated_mlp:
        return 3 * h * f / tp
    return 2 * h * f / tp + ((f / tp + h) if m.has_bias else 0)


def layer_gemm_weights_local(m: ModelSpec, tp: int) -> float:
    """Weights of one layer's column- and row-parallel GEMMs (qkv, out-proj, and the dense MLP's fc1, fc2)
    on one TP rank: the runtime accumulates their gradients inside the weight-gradient GEMM."""
    h, f = m.hidden, m.ffn_hidden
    attn = h * m.qkv_weight_rows_local(tp) + m.q_width * h / tp
    if m.is_moe:
        return attn
    return attn + (3 if m.gated_mlp else 2) * h * f / tp


def head_gemm_weights_local(m: ModelSpec, tp: int) -> float:
    """The output layer's own weight (untied models only; a tied one is the embedding's, used twice)."""
    return 0.0 if m.tie_embeddings else m.padded_vocab * m.hidden / tp


def layer_expert_params_local(m: ModelSpec, ep: int) -> float:
    """Expert weights of one layer on one rank: num_experts / ep experts, replicated across TP ranks."""
    return m.num_experts // ep * m.expert_params() if m.is_moe else 0.0


def embedding_params_local(m: ModelSpec, tp: int) -> float:
    """Input side on the first stage: the vocabulary-parallel embedding, and whole on every TP rank the learned
    positions, token types and embedding norm (as the family has them)."""
    fam = m.model_family
    n = m.padded_vocab * m.hidden / tp
    if m.learned_positions:
        n += m.max_seq_len * m.hidden
    if fam.token_types:
        n += 2 * m.hidden
    if fam.embedding_norm:
        n += m.norm_params()
    return n


def head_params_local(m: ModelSpec, tp: int, pp: int) -> float:
    """Output side on the last stage; a tied output layer on a separate stage keeps its own copy. A head transform
    (BERT's masked-LM head) adds its dense weight and bias (whole) and the output layer's bias (vocabulary-parallel)."""
    h = m.hidden
    n = m.norm_params()
    if m.model_family.head_transform:
        n += h * h + h + m.padded_vocab / tp
    if not m.tie_embeddings or pp > 1:
        n += m.padded_vocab * h / tp
    return n


def tp_replicated_tensors(m: ModelSpec, ep: int, layers: float, first: bool, last: bool,
                          tp: int = 1) -> list[tuple[float, float]]:
    """(how many, elements each) of one pipeline rank's parameter tensors that are replicated over TP while the
    activations they touch are sequence-sharded: their gradients are partial per TP rank, and the runtime
    all-reduces each over TP, one call per tensor (runtime/parallel/data_parallel.py, `sequence_parallel`; the list
    follows runtime/model.py, tensor.py and expert.py): the norms' weights and biases, the row-parallel biases,
    learned positions, token types, the embedding norm and the head transform (BERT), and under MoE the router and the
    local experts' weights, which every TP rank holds whole. Likewise the q/k norms' weights (qk_norm), which touch
    head-sharded activations: each rank's gradient is its own heads' part of the sum. Where `tp` exceeds the KV
    heads, the K/V weights (and bias) too (SharedKVQKVLinear): each rank's gradient is its own KV head's rows."""
    h, f = m.hidden, m.ffn_hidden
    fam = m.model_family
    norm = 2 if m.layernorm else 1                                  # LayerNorm: weight and bias
    per_layer = [(2 * norm, h)]
    if m.num_kv_heads < tp:
        per_layer.append((1, 2 * m.kv_width * h))                   # K/V weights, whole on every TP rank
        if m.has_qkv_bias:
            per_layer.append((1, 2 * m.kv_width))
    if m.qk_norm:
        per_layer.append((2, m.head_dim))                           # q_norm and k_norm weights
    row_biases = int(m.has_attn_out_bias) + int(m.has_bias and not m.is_moe)
    if row_biases:
        per_layer.append((row_biases, h))                           # out-proj bias (and fc2's when dense)
    if m.is_moe:
        local = m.num_experts // ep
        per_layer.append((1, m.num_experts * h))                    # router
        if m.shared_expert_ffn:                                     # shared experts' w_gate, w_up, w_down, gate
            per_layer.append((3, m.shared_expert_ffn * h))
            if m.shared_expert_gate:
                per_layer.append((1, h))
        if m.gated_mlp:
            per_layer.append((3 * local, f * h))
        else:
            per_layer += [(2 * local, f * h)] + ([(local, f), (local, h)] if m.has_bias else [])
    out = [(layers * n, e) for n, e in per_layer]
    if first:
        if m.learned_positions:
            out.append((1, m.max_seq_len * h))
        if fam.token_types:
            out.append((1, 2 * h))                                  # token types
        if fam.embedding_norm:
            out.append((norm, h))                                   # embedding norm
    if last:
        out.append((norm, h))                                       # final (head transform's) norm
        if fam.head_transform:
            out += [(1, h * h), (1, h)]                             # head transform and its bias
    return out


def grad_bytes(lay: Layout) -> int:
    """Bytes per element of the main gradients and of their data-parallel reduction (Layout.grad_dtype)."""
    return BF16_BYTES if lay.grad_dtype == "bf16" else FP32_BYTES


def state_parts_per_param(sharding: str, shard_ranks: int, grad: float = FP32_BYTES,
                          pipelined: bool = False, sharded_grads: bool = True) -> tuple[float, float, float]:
    """Persistent (weight, gradient, optimizer) bytes per parameter: the compute-dtype weight, the main gradient
    (`grad` bytes, full-size under 'none' and 'optimizer'; ZeRO-2 keeps its fp32 shard, which accumulates the
    reduced micro-batches whatever the reduction's precision), fp32 master weight and Adam m and v. Under 'full'
    the weight is the fp32 sharded parameter, which is also the master, so the optimizer part is m and v.

    `pipelined`: the rank holds its whole full-size gradient (zero2_holds_full_grads): under 'optimizer+grads' in a
    pipeline the runtime reduces a chunk's gradients only on its last micro-batch (runtime/parallel/pipeline.py sets
    the optimizer's sync there), so every bucket's full-size gradient (`grad` bytes per parameter,
    runtime/parallel/flat_buffer.py Bucket.full) is held from the chunk's first backward to its last, beside the
    fp32 shard. This counts what the runtime holds (the simulation traces it: benchmarks/results/simulation/);
    reducing every micro-batch under a pipeline would need per-chunk bucket accounting in the runtime.

    `sharded_grads` (under 'full' only): whether the step's fp32 gradient shards exist at the rank's peak
    (planner/memory/fsdp.py fsdp_holds_grads_at_peak); FSDP2 creates them at each layer's first reduce-scatter
    and frees them at the step's zero_grad, so a step of one micro-batch peaks before any exists (fsdp_reduce_bytes
    counts the one being written)."""
    d = max(shard_ranks, 1)
    weight, optim = BF16_BYTES, 3 * FP32_BYTES
    if sharding == "none":
        return weight, grad, optim
    if sharding == "optimizer":
        return weight, grad, optim / d
    if sharding == "optimizer+grads":
        return weight, FP32_BYTES / d + (grad if pipelined else 0.0), optim / d
    # full (FSDP2, runtime/parallel/fsdp.py): the sharded parameter is the fp32 master weight (no bf16 copy is kept;
    # the all-gather casts to the compute dtype), its gradient shard is fp32 too, and Adam adds m and v
    return FP32_BYTES / d, (FP32_BYTES / d if sharded_grads else 0.0), 2 * FP32_BYTES / d


def zero2_holds_full_grads(lay: Layout, num_micro: int) -> bool:
    """Whether a ZeRO-2 pipeline rank holds the full-size gradient of all its chunks at once (state_parts_per_param):
    without interleaving (its one chunk's backward spans the step), or interleaved with more micro-batches than
    pipeline ranks (the schedule runs each chunk's backward for pp micro-batches in turn, so every chunk has
    started its backward before the first finishes). Interleaved with at most pp micro-batches each chunk finishes
    before the next starts: one chunk's gradient at a time (dp_reduction_transient_bytes)."""
    return lay.sharding == "optimizer+grads" and lay.pp > 1 and (lay.vpp == 1 or num_micro > lay.pp)


def bytes_per_param(sharding: str, shard_ranks: int, grad: float = FP32_BYTES, pipelined: bool = False,
                    sharded_grads: bool = True) -> float:
    """Persistent bytes per parameter: the sum of state_parts_per_param."""
    return sum(state_parts_per_param(sharding, shard_ranks, grad, pipelined, sharded_grads))


def expert_shard_ranks(lay: Layout, over_tp: bool = False) -> int:
    """Ranks that share one expert's states: DP x CP / EP (ours, whose TP peers each keep the same experts whole and
    step them alike); over_tp (a runtime whose expert-data-parallel group spans TP too: Megatron-Core with expert
    tensor parallel 1, RuntimeTarget.expert_states_over_tp) TP x DP x CP / EP."""
    return lay.dp * lay.cp * (lay.tp if over_tp else 1) // lay.ep


@dataclass(frozen=True)
class StateStorage:
    """Bytes per parameter of a runtime whose optimizer keeps its states otherwise than ours (state_parts_per_param),
    under 'optimizer' sharding: what every data-parallel rank holds, and what is divided over the ranks that shard
    the optimizer. A runtime target with one (RuntimeTarget.state_storage) is counted by it."""
    weight_bytes: float
    """The module's weights as the GEMMs read them, on every rank."""
    grad_bytes: float
    """The main-gradient buffer the backward accumulates into, on every rank."""
    sharded_bytes: float
    """Master weights, Adam's moments and any per-shard gradient copy, divided over the optimizer's shard ranks."""

    def per_param(self, shard_ranks: int) -> float:
        return self.weight_bytes + self.grad_bytes + self.sharded_bytes / max(shard_ranks, 1)


def state_bytes(dense_params: float, expert_params: float, lay: Layout, experts_over_tp: bool = False,
                full_grads: bool = False, sharded_grads: bool = True, storage: StateStorage | None = None) -> float:
    """Persistent bytes of the rank's parameters (bytes_per_param); `full_grads`: zero2_holds_full_grads;
    `sharded_grads`: planner/memory/fsdp.py fsdp_holds_grads_at_peak; `storage`: the runtime's own state storage
    (StateStorage), used under 'optimizer' sharding."""
    d = lay.dp * lay.cp
    e = expert_shard_ranks(lay, experts_over_tp)
    if storage is not None and lay.sharding == "optimizer":
        return dense_params * storage.per_param(d) + expert_params * storage.per_param(e)
    g = grad_bytes(lay)
    piped = full_grads
    return (dense_params * bytes_per_param(lay.sharding, d, g, piped, sharded_grads)
            + expert_params * bytes_per_param(lay.sharding, e, g, piped, sharded_grads))


DP_BUCKET_ELEMENTS = 40_000_000
"""Gradient bucket size of runtime/parallel/data_parallel.py (elements)."""


def largest_layer_param_local(m: ModelSpec, tp: int) -> float:
    """Elements of the largest parameter tensor of one layer on a tensor-parallel rank (fused qkv or fc1;
    an expert's own matrices are not split by TP)."""
    h = m.hidden
    return max(m.qkv_weight_rows_local(tp) * h, (2 if m.gated_mlp else 1) * m.ffn_hidden * h / tp,
               m.ffn_hidden * h if m.is_moe else 0.0)


def largest_param_local(m: ModelSpec, tp: int) -> float:
    """Elements of the largest parameter tensor on a tensor-parallel rank (a vocabulary-sized one, usually)."""
    return max(m.padded_vocab * m.hidden / tp, largest_layer_param_local(m, tp))


def dp_reduction_transient_bytes(dense_params: float, expert_params: float, lay: Layout,
                                 largest_layer_param: float = 0.0, largest_param: float = 0.0,
                                 bucket_elems: float = DP_BUCKET_ELEMENTS, full_grads: bool = True) -> float:
    """Buffers the data-parallel gradient reduction holds at the end of backward (runtime/parallel/data_parallel.py):
    none under 'optimizer', whose reduce-scatter runs in place (each rank's shard of a bucket receives the sum, so
    no separate output per bucket stays allocated until the step waits for it); under
    'optimizer+grads' a full bucket (gradient precision) for each of the (at most two) buckets in flight and
    the one being filled. A bucket closes on the parameter that takes it past `bucket_elems`, so it holds less
    than bucket_elems plus that parameter; of the three alive at most one holds a vocabulary-sized tensor (those
    sit at the two ends of backward). tests/runtime/test_memory_model.py checks this against the buckets alive
    in a real backward. In a pipeline the buckets are reduced once per chunk (state_parts_per_param): the
    reduce-scatters' outputs, and where the rank does not hold all its chunks' full gradients at once
    (`full_grads` False, zero2_holds_full_grads) one chunk's full-size gradient."""
    d = lay.dp * lay.cp
    if d <= 1 or lay.sharding in ("none", "full"):
        return 0.0
    if lay.sharding == "optimizer":
        return 0.0  # reduced in place, into each rank's own shard of the main-gradient buffer
    if lay.pp > 1:
        params = dense_params + expert_params
        in_flight = min(3 * bucket_elems + 2 * largest_layer_param + largest_param, params)
        chunk = 0.0 if full_grads else params / lay.vpp
        return grad_bytes(lay) * (in_flight / d + chunk)
    return grad_bytes(lay) * (3 * bucket_elems + 2 * largest_layer_param + largest_param)


# -- activations per layer per micro-batch (bytes) -------------------------------------------------------
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


