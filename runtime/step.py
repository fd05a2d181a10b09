"""One optimizer step: forward/backward over the micro-batches, gradient reduction, clipping, AdamW.

`select_train_step(layout)` picks the schedule: this file's `train_step` for pp == 1; for pp > 1 the
pipeline schedule from runtime.parallel.pipeline, which must keep this signature:

    train_step(stages, micro_batches, opt, groups, lr, before_step=None) -> (loss, grad_norm)

loss and grad_norm are 0-d device tensors, so that returning does not wait for the GPU (the training loop
reads them back a step later).

stages: this rank's Stage modules (one per virtual stage); micro_batches: this rank's micro-batches of
the step, dicts of tokens/labels [b, s], optional token_types [b, s] and positions [s]; the loss returned
is the global-batch mean (the same number on every rank).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.label_count import global_label_count
from runtime.parallel.pipeline import train_step as pipeline_train_step
from runtime.parallel.tensor import group_size


def train_step(stages, micro_batches, opt, groups, lr=None, before_step=None):
    """Non-pipelined step (pp == 1): gradient accumulation; reductions only on the last micro-batch."""
    (stage,) = stages
    count = global_label_count(micro_batches, groups)
    aux_of = None
    if stage.spec.is_moe:  # MoE load-balancing losses: a mean over micro-batches and dp*cp ranks
        from runtime.parallel.expert import collect_aux_loss as aux_of
    aux_scale = 1.0 / (len(micro_batches) * max(1, group_size(groups.dp_cp)))
    opt.zero_grad()
    total = torch.zeros((), dtype=torch.float32, device=count.device)
    for i, mb in enumerate(micro_batches):
        opt.begin_micro_batch(last=i == len(micro_batches) - 1)
        loss_sum, _ = stage(mb["tokens"], mb.get("positions"), mb.get("token_types"), mb["labels"])
        loss = loss_sum / count
        total += loss.detach()
        aux = aux_of(stage) if aux_of is not None else None
        if aux is not None:
            loss = loss + aux * aux_scale
        loss.backward()
    opt.finish_grads()
    if group_size(groups.dp_cp) > 1:
        dist.all_reduce(total, group=groups.dp_cp)
    if before_step is not None:
        before_step()
    norm = opt.clip_grad_norm()
    opt.step(lr)
    return total, norm


def select_train_step(layout):
    """The step function for `layout`: the pipeline schedule when pp > 1, else this file's `train_step`."""
    if layout.pp > 1:
        return pipeline_train_step
    return train_step
