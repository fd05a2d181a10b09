"""Step time of a plan: plain arithmetic over named quantities, every time looked up in the profile.

Per layer and micro-batch on one rank (`LayerCosts`): GEMMs forward and backward (dgrad + wgrad) at the
shapes the runtime runs (tensor-parallel shards, sequence-parallel gathers), flash attention forward and
backward, elementwise kernels (norms, Qwen3's q/k norms, activations, rotary, residual adds) at the profile's
achieved bandwidth, and the communication beside them: tensor-parallel all-gather / reduce-scatter, the context-
parallel ring's K/V passes, the expert all-to-alls. Communication that an overlapped implementation hides
is at most the profile's hidden fraction of it and at most the compute it runs beside.

Per step: the runtime's pipeline schedule (1F1B or interleaved) played with each virtual stage's forward
and backward time and a hop time between ranks (planner/schedule.py: the warm-up and cool-down, and the
transfers' waits, come out of the play), then the data-parallel gradient / parameter traffic that backward
and forward do not hide, then the optimizer step over the local parameter shard.

Modules: terms (units, the overlap rule, the dataclasses of layer, end and memory costs), layer (per layer: compute
and the TP/CP/EP communication beside it; the embedding and output ends), comm (collective pricing over the
cluster's links, the pipeline hop), host (the kernel-issue floor), planner/memory/ranks.py (parameters and memory per rank),
data_parallel (gradient and parameter traffic, optimizer step), step (CostModel assembling them; evaluate).
"""
from planner.cost.step import CostModel, evaluate
from planner.cost.terms import (ADAMW_GRAD_SCALE, BF16, FP32, EndCosts, LayerCosts, MemoryTerms, exposed_s,
                                two_chunk_exposed_s)

__all__ = ["ADAMW_GRAD_SCALE", "BF16", "FP32", "CostModel", "EndCosts", "LayerCosts", "MemoryTerms", "evaluate",
           "exposed_s", "two_chunk_exposed_s"]
