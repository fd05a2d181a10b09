"""The loss's normaliser: each micro-batch loss is a sum over its labelled tokens divided by the labelled tokens
of the whole global batch, so that gradients summed over micro-batches and dp*cp ranks are the gradient of the
global-batch mean. Both schedules use it (runtime/step.py, runtime/parallel/pipeline.py)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.model import IGNORE_INDEX
from runtime.parallel.tensor import group_size


def global_label_count(micro_batches, groups) -> torch.Tensor:
    """Labelled tokens in the whole global batch (every micro-batch of every dp*cp rank)."""
    n = sum((mb["labels"] != IGNORE_INDEX).sum() for mb in micro_batches).to(torch.float32)
    if group_size(groups.dp_cp) > 1:
        dist.all_reduce(n, group=groups.dp_cp)
    return n.clamp_min(1.0)
