"""Shared pieces of the pipeline / mixed-layout tests: a single-process reference step and a pipelined step."""
from __future__ import annotations

import torch

from planner.plan import Layout, StagePlan
from runtime.label_count import global_label_count
from runtime.mesh import build_groups, single_process_groups
from runtime.model import build_model
from runtime.parallel.data_parallel import AdamConfig, build_optimizer
from runtime.parallel.expert import collect_aux_loss
from runtime.parallel.tensor import gather_logical

SEQ, GLOBAL_BATCH = 32, 8


def global_batch(spec, step):
    g = torch.Generator().manual_seed(100 + step)
    seq = torch.randint(0, spec.vocab_size, (GLOBAL_BATCH, SEQ + 1), generator=g)
    return dict(tokens=seq[:, :-1], labels=seq[:, 1:])


def micro_batches(spec, step, dp, dp_rank, mb, cp=1, cp_rank=0):
    from runtime.parallel.context import sequence_positions, shard_sequence
    full = global_batch(spec, step)
    per = GLOBAL_BATCH // dp
    out = []
    for i in range(0, per, mb):
        lo = dp_rank * per + i
        d = {k: shard_sequence(v[lo:lo + mb], cp_rank, cp, dim=1) for k, v in full.items()}
        if cp > 1:
            d["positions"] = sequence_positions(SEQ, cp_rank, cp)
        out.append(d)
    return out


def reference(spec, mb=2, steps=2, lr=1e-3):
    """Single process, no recompute: losses of `steps` steps and the first step's gradients (by name).
    Each micro-batch loss: sum / global labelled tokens + MoE aux / micro-batches."""
    groups = single_process_groups()
    model = build_model(spec, groups)
    opt = build_optimizer([model], groups, "none", AdamConfig(lr=lr))
    losses, grads = [], {}
    for step in range(steps):
        mbs = micro_batches(spec, step, 1, 0, mb)
        count = global_label_count(mbs, groups)
        opt.zero_grad()
        total = 0.0
        for i, b in enumerate(mbs):
            opt.begin_micro_batch(last=i == len(mbs) - 1)
            loss_sum, _ = model(b["tokens"], None, None, b["labels"])
            loss = loss_sum / count
            aux = collect_aux_loss(model)
            (loss + aux / len(mbs) if aux is not None else loss).backward()
            total += loss.item()
        opt.finish_grads()
        if step == 0:
            grads = {n: g.clone() for n, g in opt.full_local_grads().items()}
        opt.clip_grad_norm()
        opt.step()
        losses.append(total)
    return losses, grads


def pipelined(spec, lay: Layout, stage_plans: list[StagePlan], steps=2, lr=1e-3):
    """The same steps under `lay` with the pipeline schedule; returns (losses, grads gathered over TP by
    name, groups)."""
    from runtime.parallel.pipeline import build_pipeline_stages, train_step
    groups = build_groups(lay, "cpu")
    stages = build_pipeline_stages(spec, groups, stage_plans)
    opt = build_optimizer(stages, groups, lay.sharding, AdamConfig(lr=lr), bucket_elems=20_000)
    named = {n: p for st in stages for n, p in st.named_parameters()}
    grads = {}

    def capture():
        for n, g in opt.full_local_grads().items():
            p = named[n]
            grads[n] = gather_logical(g, p.tp_dim, p.tp_parts, groups.tp)

    losses = []
    for step in range(steps):
        mbs = micro_batches(spec, step, lay.dp, groups.dp_rank, lay.micro_batch, lay.cp, groups.cp_rank)
        loss, _ = train_step(stages, mbs, opt, groups, lr, before_step=capture if step == 0 else None)
        losses.append(float(loss))
    return losses, grads, groups


def compare(ref, got, tag, atol=2e-5, rtol=1e-4):
    ref_losses, ref_grads = ref
    losses, grads = got
    assert grads, tag
    for n, g in grads.items():
        want_name = "embedding.word.weight" if n == "head.word_weight" else n
        torch.testing.assert_close(g, ref_grads[want_name], atol=atol, rtol=rtol, msg=f"{tag}: grad {n}")
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) < 1e-5 * max(1.0, abs(b)), f"{tag}: losses {losses} vs reference {ref_losses}"
