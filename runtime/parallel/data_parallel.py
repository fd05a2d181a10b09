"""Data parallelism over the dp*cp group, at the planner's four sharding levels, with AdamW.

  none             every rank keeps fp32 master weights, Adam m and v; gradients all-reduced (DDP)
  optimizer        the distributed optimizer (ZeRO-1): master, m, v sharded over dp*cp; gradients
                   reduce-scattered; updated parameters all-gathered after the step
  optimizer+grads  ZeRO-2: also the accumulated fp32 gradient is sharded; each bucket's full-size fp32
                   gradient lives only until its reduce-scatter is done (so it reduce-scatters after every
                   micro-batch, as DeepSpeed ZeRO-2 does: there is no full gradient to accumulate into)
  full             FSDP2 (`torch.distributed.fsdp.fully_shard`, PyTorch's): parameters too, gathered per
                   layer ahead of use and freed after

Ours for the first three (as Megatron-Core's DistributedDataParallel + DistributedOptimizer): the model's
parameters (bf16 on GPU) are views into one flat buffer per reduction group, split into buckets in
backward order. A post-accumulate-grad hook adds each parameter's gradient into an fp32 main-grad buffer
(fp32 accumulation over micro-batches) and frees the low-precision one; when the last micro-batch has
filled a bucket, its reduction is launched asynchronously while backward continues. After the step,
parameter all-gathers are launched for every bucket and each module's forward pre-hook waits only for the
buckets of its own parameters, so the gather overlaps the next forward.

Memory per parameter (what the planner counts): compute-dtype weight (2 B bf16) + main grad (4 B fp32, or 2 B
with grad_dtype bf16; ZeRO-2 keeps an fp32 shard, /n, plus the in-flight buckets) + fp32 master (4 B, /n when
sharded) + Adam m, v (8 B, /n). The main gradients' precision is also that of their reduction (the plan's
Layout.grad_dtype: Megatron-Core's grad_reduce_in_fp32 on or off).
Loss convention: each micro-batch loss is a sum divided by the labelled tokens of the global batch, so
gradients are SUMMED (not averaged) over dp*cp.
Sequence-parallel parameters (p.sequence_parallel) get their partial gradients all-reduced over TP first.
Expert parameters (p.expert, MoE) reduce over the expert-data-parallel group in a buffer of their own.

Files: runtime/parallel/flat_buffer.py lays out the flat buffers and their buckets; distributed_optimizer.py
holds the hooks, the bucket reductions, the norm, the update and the all-gathers of the first three levels;
fsdp.py wires FSDP2 for 'full'; adamw.py holds AdamConfig and the update kernel. This file picks one.
"""
from __future__ import annotations

import torch

from runtime.parallel.adamw import AdamConfig
from runtime.parallel.distributed_optimizer import DistributedOptimizer
from runtime.parallel.flat_buffer import counts_in_grad_norm
from runtime.parallel.fsdp import FullyShardedOptimizer

__all__ = ["GRAD_DTYPES", "AdamConfig", "DistributedOptimizer", "FullyShardedOptimizer", "build_optimizer",
           "counts_in_grad_norm"]

GRAD_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The plan's Layout.grad_dtype names -> torch dtypes (on CPU too: the plan's numerics are kept exactly)."""


def build_optimizer(modules, groups, sharding, cfg=None, compute_dtype=torch.float32, overlap=True,
                    bucket_elems=40_000_000, grad_dtype=torch.float32):
    """The optimizer for `sharding`; grad_dtype is the main gradients' precision and their reduction's."""
    if sharding == "full":
        return FullyShardedOptimizer(modules, groups, cfg, compute_dtype, overlap, grad_dtype)
    return DistributedOptimizer(modules, groups, sharding, cfg, compute_dtype, bucket_elems, overlap, grad_dtype)
