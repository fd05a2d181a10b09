"""Memory per pipeline rank, counted in bytes from the tensors the runtime allocates: the parameters' states and
buffers, workspaces and the allowance (activations: planner/memory/activations.py).

Per parameter (mixed precision as the runtime runs it): a bf16 compute copy (2 B), an fp32 gradient
(4 B), an fp32 master copy (4 B) and Adam's two fp32 moments (8 B). Sharding over the data x context
ranks (d of them) divides: master + Adam by d for 'optimizer'; also gradients for 'optimizer+grads';
everything for 'full' (plus what FSDP2 gathers and reduces: planner/memory/fsdp.py). Expert weights are sharded
over the expert-data-parallel group (d / ep ranks) instead.

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
from planner.plan import Layout
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
