"""The MoE router (runtime/parallel/expert.py).

Routing: softmax over the experts (fp32), top-k, weights renormalised to sum to one (Mixtral;
`normalize_topk=False` keeps the raw softmax weights, as Qwen2-MoE's default). Load-balancing loss (Switch
Transformer / Mixtral's `load_balancing_loss_func`): aux = E * sum_e f_e * P_e with f_e the fraction of the
(token, slot) assignments sent to expert e, summed over the k slots, and P_e the mean router probability of
e, over the micro-batch's tokens. Under TP (sequence parallel) and CP each rank holds a shard of them: f is
summed over the cp x tp group (`groups.cp_tp`, a [k, E] all-reduce of counts, no gradient) and P stays local,
so the rank's loss E * sum_e f_e * P_e(local) averaged over the tp * cp shards is exactly the loss of the whole
micro-batch, whatever the layout. After each forward MoEMLP's `aux_loss` holds the rank's loss (a tensor in the
graph) divided by the TP degree (summing gradients over TP averages over TP). The training loop adds it to
each micro-batch's loss, scaled to a mean over micro-batches and dp*cp ranks since gradients are summed over
both:
    loss = loss_sum / global_label_count + collect_aux_loss(stage) / (num_micro_batches * dp * cp)
(`collect_aux_loss` multiplies by each layer's `aux_coeff`). It must be collected right after the
forward that produced it (a later forward, or a recompute, replaces the attribute).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def route(x2d: torch.Tensor, weight: torch.Tensor, top_k: int, normalize_topk: bool, seq_group=None):
    """Returns (expert ids [T, k], weights [T, k] fp32, aux loss) for the rows x2d [T, hidden] and the router
    weight [E, hidden]; seq_group: the ranks holding the other shards of these sequences, or None."""
    logits = _RouterLogits.apply(x2d, weight)
    probs = torch.softmax(logits, dim=-1)
    topv, topi = probs.topk(top_k, dim=-1)
    if normalize_topk:
        topv = topv / topv.sum(-1, keepdim=True)
    E = weight.size(0)
    with torch.no_grad():  # f_e: no gradient flows through the top-k choice
        tokens_per_expert = F.one_hot(topi, E).to(probs.dtype).mean(0)   # [k, E]
        if seq_group is not None:  # the shards are equal (sequence parallel, CP's mirrored chunks)
            dist.all_reduce(tokens_per_expert, group=seq_group)
            tokens_per_expert /= dist.get_world_size(seq_group)
    aux = E * (tokens_per_expert * probs.mean(0)).sum()
    return topi, topv, aux


def _tensor_core_router(x: torch.Tensor, w: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16)


class _RouterLogits(torch.autograd.Function):
    """fp32 router logits x @ W^T. On CUDA with bf16 x and W one bf16 GEMM with an fp32 output: the same products,
    summed in fp32, as the fp32 GEMM of their upcast copies, without making those copies or keeping x's fp32
    copy for backward (it keeps x as it is). Why: upcast operands run on an fp32 (non-tensor-core) kernel,
    80 us a call at 8192 x 2048 x 8, and a kept fp32 copy is 4 bytes per hidden element per token. Backward
    likewise: the logits' gradient rounded to x's dtype (the rest of the backward runs in it) and both GEMMs on
    tensor cores summing in fp32; the weight gradient comes out in fp32 before its cast. Through upcast copies
    they would be two fp32 GEMMs and an fp32 copy of x, about 4 ms of a 232 ms MoE step. On CPU (the tests'
    fp32 models) everything stays fp32."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        if _tensor_core_router(x, w):
            return torch.ops.aten.mm.dtype(x, w.t(), torch.float32)
        return F.linear(x.float(), w.float())

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if _tensor_core_router(x, w):
            gl = g.to(x.dtype)
            return gl @ w, torch.ops.aten.mm.dtype(gl.t(), x, torch.float32).to(w.dtype)
        g = g.float()
        return (g @ w.float()).to(x.dtype), (g.t() @ x.float()).to(w.dtype)

