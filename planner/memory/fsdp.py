"""FSDP2's memory under sharding 'full' (runtime/parallel/fsdp.py), beside the states per parameter of
planner/memory/model.py: the unsharded weights it gathers, the gradients and reduce-scatter buffers it holds through
backward, and whether the step's sharded gradients exist at the rank's peak; MemoryTermsOfRanks
(planner/memory/ranks.py) sets the reduction against the activations freed before it."""
from __future__ import annotations

from planner.memory.model import (BF16_BYTES, FP32_BYTES, grad_bytes, head_params_local, layer_dense_params_local,
                                  layer_expert_params_local)
from planner.model import ModelSpec
from planner.plan import Layout


def fsdp_holds_grads_at_peak(lay: Layout, num_micro: int) -> bool:
    """Whether a rank under 'full' holds the step's sharded gradients at its peak: FSDP2 (runtime/parallel/fsdp.py)
    reduce-scatters every micro-batch's gradients into fp32 shards that live from a layer's first reduce-scatter
    to the next step's zero_grad. With one micro-batch per step the peak (the first layers of the step's only
    backward, the activations at their most) comes before the shards exist, as the simulation traces
    (benchmarks/results/simulation/); with more, every backward after the first runs beside them. True for the
    other sharding levels, whose gradients exist throughout."""
    return lay.sharding != "full" or num_micro > 1


def fsdp_layer_params_local(m: ModelSpec, lay: Layout) -> float:
    """Elements of one FSDP unit (a layer) on this rank before sharding: its dense and expert parameters."""
    return layer_dense_params_local(m, lay.tp) + layer_expert_params_local(m, lay.ep)


def fsdp_gather_bytes(m: ModelSpec, lay: Layout, root_params: float = 0.0) -> float:
    """ZeRO-3 / FSDP2 as runtime/parallel/data_parallel.py applies it (each layer a unit, embedding + head the root
    unit): the unsharded bf16 weights held through forward and backward. Two layers' at once, the layer in use
    and the next one, whose all-gather output FSDP2 allocates when it prefetches it; and the root unit's weights
    (`root_params`: this rank's embedding and head), which FSDP2 keeps gathered from the root's forward to the end
    of its backward. The gradients and the reduction in backward: fsdp_reduce_bytes, fsdp_layer_grad_bytes,
    fsdp_head_grad_bytes."""
    if lay.sharding != "full":
        return 0.0
    return 2 * fsdp_layer_params_local(m, lay) * BF16_BYTES + root_params * BF16_BYTES


def head_grad_params_local(m: ModelSpec, tp: int) -> float:
    """Elements of the output side's gradient on the stage holding it (head_params_local with the output layer's
    weight always counted): the output layer writes its weight's gradient whether the weight is its own or the
    tied embedding's."""
    return head_params_local(m, tp, pp=2)


def fsdp_reduce_bytes(m: ModelSpec, lay: Layout, sharded_grads: bool = True) -> float:
    """What FSDP2's gradient reduction holds through a layer's backward (after the first of its chunk's), beyond
    fsdp_gather_bytes: one layer's reduce-scatter input (torch's foreach_reduce copies the unsharded gradients into
    one buffer of the reduction's dtype, Layout.grad_dtype), the previous layer's, which FSDP2 keeps until the
    next reduce-scatter is issued (one input buffer in flight); and its output, that layer's fp32 gradient shard,
    where the step's shards are not counted in the state (`sharded_grads` False: fsdp_holds_grads_at_peak).
    The previous layer's backward has ended, so its activations are gone (MemoryTermsOfRanks.fsdp_backward_bytes
    sets them against these bytes, as the simulation traces it: benchmarks/results/simulation/)."""
    if lay.sharding != "full":
        return 0.0
    per_layer = fsdp_layer_params_local(m, lay)
    shard = 0.0 if sharded_grads else FP32_BYTES * per_layer / (lay.dp * lay.cp)
    return grad_bytes(lay) * per_layer + shard


def fsdp_layer_grad_bytes(m: ModelSpec, lay: Layout) -> float:
    """The unsharded bf16 gradients of the layer in backward under 'full': autograd writes them beside the
    layer's unsharded weights, GEMM by GEMM, until FSDP2's post-backward copies them into the reduce-scatter
    input; all of them exist at the end of the layer's backward, when its activations are (nearly) freed."""
    return BF16_BYTES * fsdp_layer_params_local(m, lay) if lay.sharding == "full" else 0.0


def fsdp_head_grad_bytes(m: ModelSpec, lay: Layout) -> float:
    """The output side's unsharded bf16 gradient under 'full' on the stage holding the head
    (head_grad_params_local): written at the start of the chunk's backward and reduce-scattered with the root unit
    at its end, so held through every layer's backward."""
    return BF16_BYTES * head_grad_params_local(m, lay.tp) if lay.sharding == "full" else 0.0
