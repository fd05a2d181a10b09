"""The bytes per step of each collective kind that the cost model prices for one pipeline rank.

The cost model (planner/cost/layer.py, data_parallel.py, comm.py) turns each collective's bytes straight into
seconds; this module restates those bytes, term by term, per (kind, group) and per step, so that the
simulation's traced collectives can be set beside them:
  tp   per layer and micro-batch: forward all-gather + reduce-scatter of [tokens, hidden] bf16 per GEMM pair
       (two pairs in a dense layer, one in an MoE layer), backward two all-gathers + one reduce-scatter per pair
       (layer.py), and a fully recomputed layer's forward once more (terms.py full_recompute_s); the head's and embedding's gathers and scatters and the loss's two fp32 all-reduces (_ends);
       the gradients of TP-replicated parameters all-reduced once per step (data_parallel.py tp_grad_reduce_s)
  dp   the gradient reduce-scatter and the parameter all-gather of the rank's parameters over dp x cp (experts
       over their expert-data-parallel group), an all-reduce under 'none', per micro-batch where the level says
       (data_parallel.py dp_comm_s)
  pp   one [tokens, hidden / tp] bf16 activation per hop and micro-batch (comm.py p2p_s), sent forward by every
       chunk but the last stage and backward by every chunk but the first, received likewise
  cp   ring attention's K/V (and in backward dK/dV) passes, cp - 1 per layer and micro-batch, the forward's again
       in a fully or selectively recomputed layer (layer.py)
  ep   the MoE dispatch and combine all-to-alls of every routed copy (tokens / tp x top_k x hidden, bf16), each way
       in forward and in backward (layer.py _ep_all_to_all_s; the small all-to-all of the counts is not priced)
  embedding  the tied word embedding's gradient all-reduced once per step between the first and the last pipeline
       rank (data_parallel.py tied_embedding_grad_bytes)
Where the cost model puts a term on another rank than the runtime issues it (the embedding's TP collectives are
priced with the head's, on the last stage), the bytes here follow the runtime: they are on the first stage.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost.step import CostModel
from planner.plan import Plan

BF16, FP32 = 2, 4


def cost_model(plan: Plan) -> CostModel:
    """The cost model that `plan validate` predicts the plan with (our runtime, eager where it cannot capture)."""
    from planner.cost.targets import load_target
    from planner.profile import load_profile
    from planner.profile.files import default_profile_path

    cluster = ClusterSpec.from_dict(plan.cluster)
    # the memory and collective bytes predicted here read no timing: a GPU kind without a shipped profile (the CPU
    # runs) is priced with the H200's
    shipped = default_profile_path(cluster.gpu).exists()
    profile = load_profile(None, cluster.gpu if shipped else "h200-sxm", True)
    target = load_target("ours")
    layout = plan.layout if target.cuda_graph or not plan.layout.cuda_graph else replace(plan.layout, cuda_graph=False)
    return CostModel(plan.model, plan.training, layout, cluster, profile, target=target)


def predicted_collectives(cm: CostModel, plan: Plan, pp_rank: int) -> dict[tuple[str, str], float]:
    """(kind, group) -> bytes per step of pipeline rank `pp_rank` (see the module docstring)."""
    m, lay = cm.m, cm.lay
    out: dict[tuple[str, str], float] = defaultdict(float)
    chunks = cm.rank_chunks(pp_rank)
    rank_stages = [(j, plan.stages[j]) for j in chunks]
    last_j = lay.pp * lay.vpp - 1
    first, last = 0 in chunks, last_j in chunks
    layers = sum(st.layers for _, st in rank_stages)
    n, t = cm.num_micro, lay.tp
    T = cm.tokens
    if t > 1:
        nbytes = BF16 * T * m.hidden
        pairs = 1 if m.is_moe else 2
        full = sum(st.full_recompute_layers for _, st in rank_stages)  # their forward again (full_recompute_s)
        out[("all_gather", "tp")] += n * (3 * layers + full) * pairs * nbytes
        out[("reduce_scatter", "tp")] += n * (2 * layers + full) * pairs * nbytes
        if first:
            out[("all_gather", "tp")] += n * nbytes
            out[("reduce_scatter", "tp")] += n * nbytes
        if last:  # the head's input gathered in forward and again for its weight gradient in backward (_ends)
            out[("all_gather", "tp")] += n * 2 * nbytes
            out[("reduce_scatter", "tp")] += n * nbytes
            out[("all_reduce", "tp")] += n * 3 * FP32 * T
        shard = lay.dp * lay.cp if lay.sharding == "full" else 1
        calls = cm.zero2_reductions if lay.sharding == "optimizer+grads" else 1
        out[("all_reduce", "tp")] += calls * sum(k * mem.grad_bytes(lay) * e / shard
                                              for k, e in mem.tp_replicated_tensors(m, lay.ep, layers, first, last))
    if m.is_moe and lay.ep > 1:  # dispatch and combine, each way in forward and again in backward (layer.py)
        out[("all_to_all", "ep")] += n * 4 * (layers + sum(st.full_recompute_layers for _, st in rank_stages)) \
            * BF16 * (T / t) * m.top_k * m.hidden
    if lay.cp > 1:  # a fully or selectively recomputed layer reruns the ring's forward (Attention.core)
        reruns = sum(st.full_recompute_layers + st.selective_recompute_layers for _, st in rank_stages)
        _context_parallel(cm, out, layers + reruns, layers)
    _data_parallel(cm, out, *cm.rank_params(rank_stages))
    tied = cm.tied_embedding_grad_bytes(first, last)
    if tied > 0:
        out[("all_reduce", "embedding")] += tied
    if lay.pp > 1:
        hop = BF16 * T * m.hidden / t
        fwd_hops = sum(1 for j in chunks if j != last_j)
        bwd_hops = sum(1 for j in chunks if j != 0)
        out[("send", "pp")] += n * (fwd_hops + bwd_hops) * hop
        out[("recv", "pp")] += n * (fwd_hops + bwd_hops) * hop
    return dict(out)


def _context_parallel(cm: CostModel, out: dict, forwards: float, backwards: float) -> None:
    """Ring attention per micro-batch (layer.py): cp - 1 steps pass K and V in each forward; each backward passes
    K and V again and dK, dV (cp - 1 bf16 steps, or cp fp32 steps of twice the bytes where RuntimeTarget.dkv_ring_fp32)."""
    m, lay, t = cm.m, cm.lay, cm.lay.tp
    kv_heads = m.num_heads if cm.target.cp_kv_expanded else m.num_kv_heads
    kv = BF16 * 2 * lay.micro_batch * (kv_heads // t) * (cm.shape.seq_len // lay.cp) * m.head_dim
    grad = lay.cp * 2 * kv if cm.target.dkv_ring_fp32 else (lay.cp - 1) * kv
    per_mb = forwards * (lay.cp - 1) * kv + backwards * ((lay.cp - 1) * kv + grad)
    out[("send", "cp")] += cm.num_micro * per_mb
    out[("recv", "cp")] += cm.num_micro * per_mb


def _data_parallel(cm: CostModel, out: dict, dense: float, expert: float) -> None:
    lay = cm.lay
    d = lay.dp * lay.cp
    grad = mem.grad_bytes(lay)
    for params, size, group in ((dense, d, "dp_cp"), (expert, d // lay.ep, "expert_dp")):
        if size <= 1 or params <= 0:
            continue
        if lay.sharding == "none":
            out[("all_reduce", group)] += grad * params
        elif lay.sharding == "optimizer":
            out[("reduce_scatter", group)] += grad * params
            out[("all_gather", group)] += BF16 * params
        elif lay.sharding == "optimizer+grads":
            out[("reduce_scatter", group)] += cm.zero2_reductions * grad * params
            out[("all_gather", group)] += BF16 * params
        else:
            out[("all_gather", group)] += cm.num_micro * 2 * BF16 * params
            out[("reduce_scatter", group)] += cm.num_micro * grad * params
