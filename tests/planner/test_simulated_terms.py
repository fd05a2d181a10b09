"""The cost and memory terms that the simulation of plans' ranks (runtime/simulate/) set beside the runtime's
traced collectives and tensors, by hand: the tied embedding's gradient all-reduce between the first and last
pipeline rank, the output layer's backward re-gather of its input, ring attention's fp32 dK/dV passes, the
full-size gradient buckets ZeRO-2 holds under a pipeline, what an MoE layer keeps and its largest transient, and
FSDP2's buffers at its peak."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.cost.targets import OURS, RuntimeTarget
from planner.cost.terms import exposed_s
from planner.model import resolve_model, tiny_model
from planner.plan import Layout, StagePlan, TrainingShape


def _cm(profile, m, n, target=OURS, seq_gb=(256, 8), **kw) -> CostModel:
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=n, gpus_per_node=min(n, 8))
    return CostModel(m, TrainingShape(*seq_gb), Layout(**kw), cluster, profile, target=target)


def _gpt():
    return tiny_model("gpt", hidden=256, ffn_hidden=512, num_layers=4, num_heads=8, num_kv_heads=8,
                      vocab_size=1024, max_seq_len=256, tie_embeddings=True)


def test_tied_embedding_gradient_all_reduce_by_hand(profile):
    """[vocab / tp, hidden] in the main gradients' precision on the first and last pipeline rank only; a shard in
    fp32 under FSDP; none without a pipeline or without tying."""
    m = _gpt()
    cm = _cm(profile, m, 16, tp=2, pp=2, dp=4, sharding="optimizer")
    word = m.padded_vocab * m.hidden / 2
    assert cm.tied_embedding_grad_bytes(True, False) == 4 * word
    assert cm.tied_embedding_grad_bytes(False, True) == 4 * word
    assert cm.tied_embedding_grad_bytes(False, False) == 0
    want = cm.group_collective_s("all_reduce", 4 * word, 2, cm.strides["pp"]) * profile.eff("dp")
    assert cm.tied_embedding_reduce_s(True, False) == pytest.approx(want, rel=1e-12) and want > 0
    bf16 = _cm(profile, m, 16, tp=2, pp=2, dp=4, sharding="optimizer", grad_dtype="bf16")
    assert bf16.tied_embedding_grad_bytes(True, False) == 2 * word
    full = _cm(profile, m, 16, tp=2, pp=2, dp=4, sharding="full")
    assert full.tied_embedding_grad_bytes(True, False) == 4 * word / 4
    assert _cm(profile, m, 8, tp=2, dp=4).tied_embedding_grad_bytes(True, True) == 0
    untied = _cm(profile, replace(m, tie_embeddings=False), 16, tp=2, pp=2, dp=4)
    assert untied.tied_embedding_grad_bytes(True, False) == 0


def test_output_layer_backward_regathers_its_input(profile):
    """The ends' TP traffic: the embedding's and the head's gather and scatter, and the head's backward gathering
    its sequence-sharded input again: three all-gathers and two reduce-scatters of [tokens, hidden] bf16, and the
    loss's two fp32 all-reduces."""
    m = _gpt()
    cm = _cm(profile, m, 2, tp=2, micro_batch=2)
    T = 2 * 256
    ag = cm.group_collective_s("all_gather", 2 * T * m.hidden, 2, 1)
    rs = cm.group_collective_s("reduce_scatter", 2 * T * m.hidden, 2, 1)
    ar = cm.group_collective_s("all_reduce", 4 * T, 2, 1) + cm.group_collective_s("all_reduce", 8 * T, 2, 1)
    assert cm.ends.head_comm_s == pytest.approx((3 * ag + 2 * rs + ar) * profile.eff("tp"), rel=1e-12)


def test_ours_passes_dk_dv_in_fp32_around_the_ring(profile):
    """runtime/parallel/context.py sends its fp32 dK, dV accumulator through every rank: cp steps of twice K and V's
    bf16 bytes, the last one waited; K and V pass cp - 1 times each way in bf16."""
    assert OURS.dkv_ring_fp32 and not RuntimeTarget("t").dkv_ring_fp32
    assert RuntimeTarget("t", cp_fp32_buffers=True).dkv_ring_fp32
    m = resolve_model("llama3-8b")
    kw, seq_gb = dict(cp=4, micro_batch=1, cuda_graph=False), (32768, 4)
    cm = _cm(profile, m, 4, OURS, seq_gb, **kw)
    plain = _cm(profile, m, 4, replace(OURS, cp_dkv_fp32=False), seq_gb, **kw)
    kv = 2 * 2 * m.num_kv_heads * (32768 // 4) * m.head_dim
    step = cm.group_collective_s("send_recv", kv, 4, cm.strides["cp"]) * profile.eff("cp")
    grad_step = cm.group_collective_s("send_recv", 2 * kv, 4, cm.strides["cp"]) * profile.eff("cp")
    frac = profile.overlap_hidden_fraction.get("cp", 0.0)
    # the attention blocks beside the ring are the same in both (only the bytes of dK, dV differ)
    assert cm.layer.bwd_compute_s == plain.layer.bwd_compute_s
    fwd_ring = plain.layer.comm_by_dim_s["cp"] - exposed_s(3 * step + 3 * step, _attn_b(cm, m), frac, True)
    want = fwd_ring + exposed_s(3 * step + 3 * grad_step, _attn_b(cm, m), frac, True) + grad_step
    assert cm.layer.comm_by_dim_s["cp"] == pytest.approx(want, rel=1e-9)
    assert cm.layer.comm_by_dim_s["cp"] > plain.layer.comm_by_dim_s["cp"]


def _attn_b(cm, m) -> float:
    prof = cm.prof
    return prof.eff("ring") * prof.eff("compute") * prof.attention_s(1, m.num_heads, 8192, 32768, m.head_dim, True,
                                                                     True)


def test_zero2_under_a_pipeline_holds_the_full_gradient():
    """ZeRO-2 in a pipeline: the bf16 weight, the full-size gradient buckets (gradient precision) and the fp32
    gradient shard, master and moments over d; without a pipeline only the shards. Interleaved with at most pp
    micro-batches one chunk's full gradient at a time (in the transient)."""
    assert mem.state_parts_per_param("optimizer+grads", 4, 4, pipelined=False) == (2, 1, 3)
    assert mem.state_parts_per_param("optimizer+grads", 4, 4, pipelined=True) == (2, 4 + 1, 3)
    assert mem.bytes_per_param("optimizer+grads", 4, 2, pipelined=True) == 2 + 2 + 1 + 3
    assert mem.bytes_per_param("optimizer", 4, 4, pipelined=True) == mem.bytes_per_param("optimizer", 4, 4) == 2 + 4 + 3
    piped = Layout(pp=2, dp=4, sharding="optimizer+grads")
    inter = Layout(pp=2, vpp=4, dp=4, sharding="optimizer+grads")
    assert mem.zero2_holds_full_grads(piped, 2) and mem.zero2_holds_full_grads(inter, 4)
    assert not mem.zero2_holds_full_grads(inter, 2) and not mem.zero2_holds_full_grads(Layout(dp=4), 8)
    assert not mem.zero2_holds_full_grads(Layout(pp=2, dp=4, sharding="optimizer"), 8)
    assert mem.state_bytes(1e9, 0, piped, full_grads=True) - mem.state_bytes(1e9, 0, piped) == pytest.approx(4e9)
    # the reduce-scatters' outputs (a shard of each bucket in flight) on top, under a pipeline
    assert mem.dp_reduction_transient_bytes(1e6, 0, piped, 1e5, 2e5) == pytest.approx(4 * 1e6 / 4)
    assert mem.dp_reduction_transient_bytes(1e9, 0, piped, 1e5, 2e5) == pytest.approx(4 * (120e6 + 4e5) / 4)
    # one chunk (a quarter of the rank's parameters) at a time
    assert mem.dp_reduction_transient_bytes(1e9, 0, inter, 1e5, 2e5, full_grads=False) == \
        pytest.approx(4 * (120e6 + 4e5) / 4 + 4 * 1e9 / 4)


def test_zero2_in_a_pipeline_reduces_once_per_step(profile):
    """The runtime reduces ZeRO-2's gradients on each chunk's last micro-batch in a pipeline: one reduce-scatter a
    step there, one per micro-batch without a pipeline."""
    m = _gpt()
    assert _cm(profile, m, 8, pp=2, dp=4, sharding="optimizer+grads").zero2_reductions == 1
    flat = _cm(profile, m, 4, dp=4, sharding="optimizer+grads")
    assert flat.zero2_reductions == flat.num_micro > 1


def test_selective_recompute_reruns_the_ring_forward(profile):
    """Selective recompute checkpoints the attention core (runtime/model.py), so under context parallelism its
    rerun passes K and V around the ring again: the forward's exposed ring time is in selective_recompute_s."""
    m = resolve_model("llama3-8b")
    kw, seq_gb = dict(cp=4, micro_batch=1, cuda_graph=False), (32768, 4)
    cm = _cm(profile, m, 4, OURS, seq_gb, **kw)

    class NoRing(CostModel):
        def _cp_comm_s(self, attn_f, attn_b):
            return 0.0, 0.0

    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=4, gpus_per_node=4)
    bare = NoRing(m, TrainingShape(*seq_gb), Layout(**kw), cluster, profile, target=OURS)
    cp_f = cm.layer.fwd_comm_s - bare.layer.fwd_comm_s
    assert cp_f > 0
    assert cm.layer.selective_recompute_s - bare.layer.selective_recompute_s == pytest.approx(cp_f, rel=1e-9)


def test_expert_parallel_keeps_one_input_copy_per_routed_token():
    """Under EP the dispatch's gather and all-to-all save only indices: a routed copy keeps its expert input (the
    received one) and its expert output, as without EP (the simulation traces it: benchmarks/results/simulation/),
    and 16 bytes more of indices (the received rows' int64 regrouping order and its inverse)."""
    m = resolve_model("mixtral-8x7b")
    shape = TrainingShape(4096, 8)
    with_ep = mem.layer_activations(m, shape, Layout(dp=8, ep=8))
    without = mem.layer_activations(m, shape, Layout(dp=8))
    assert with_ep.none_bytes - without.none_bytes == 16 * 4096 * 2   # 4096 tokens, top 2


def test_mixtral_layer_memory_by_hand():
    """Mixtral 8x7B at EP 8, one sequence of 4096 tokens: what its MoE layer keeps (the router's fp32
    probabilities and 56 bytes of routing indices and weights per routed copy, its input being the norm output that
    gemm_in counts) and its largest transient (an expert's backward: f + 2f gradient rows per routed copy; the EP
    dispatch's five hidden-wide copies are smaller here), as the simulation traces them
    (benchmarks/results/simulation/)."""
    m = resolve_model("mixtral-8x7b")
    a = mem.layer_activations(m, TrainingShape(4096, 8), Layout(dp=8, ep=8))
    T, R, h, f = 4096, 2 * 4096, 4096, 14336
    norms_in = 2 * (2 * h + 4) * T            # the two norms' inputs (bf16) and their fp32 rstd
    gemm_in = 2 * 2 * h * T                   # the two norms' outputs (the QKV input, the MoE input)
    qkv = 2 * (h + 2 * 1024) * T              # q, k, v (8 KV heads of 128)
    attn_out = 2 * h * T + 4 * 32 * T         # the attention output and its log-sum-exp
    router = 4 * 8 * T + 56 * R               # fp32 probabilities over 8 experts; indices per routed copy
    experts = 2 * (3 * f + 2 * h) * R         # per routed copy: expert input, SwiGLU input (2f) and product, output
    assert a.none_bytes == norms_in + gemm_in + qkv + attn_out + router + experts == 1058111488
    assert a.working_bytes == max(2 * R * (f + 2 * f), 2 * R * h * 5, 3 * 2 * (h + 2 * 1024) * T) == 704643072


def test_fsdp_peak_by_hand():
    """'full' with one micro-batch per step, as the simulation traces FSDP2's peak (the second layer of the step's
    only backward): no sharded gradient yet; two layers' bf16 weights (the one in use, the prefetched one) and the
    root unit's; the previous layer's fp32 reduce-scatter input and its gradient shard, the layer's own unsharded
    bf16 gradients by the end of its backward and the output layer's bf16 gradient, less the activations freed
    before them (the last layer's and the head's kept tensors); with two micro-batches the shards are held."""
    m = _gpt()
    shape, d, L = TrainingShape(256, 4), 4, 4
    lay = Layout(dp=d, micro_batch=1, sharding="full")
    cluster = ClusterSpec(gpu="cpu", num_gpus=d, gpus_per_node=d)
    h, f, V = 256, 512, 1024
    P = (4 * h * h + 4 * h) + 2 * 2 * h + (2 * h * f + f + h)   # attention (with biases), two LayerNorms, MLP
    assert mem.fsdp_layer_params_local(m, lay) == P == 527104
    root = V * h + 256 * h + 2 * h                              # tied embedding, learned positions, final norm
    head_grad = 2 * h + V * h                                   # the final norm and the output layer's weight
    acts = mem.layer_activations(m, shape, lay)
    head_kept, head_transient = mem.head_activation_bytes(m, shape, lay)
    state = (L * P + root) * (4 + 8) / d                        # fp32 shard (the master) and Adam's m, v
    gathered = 2 * 2 * P + 2 * root
    net = 4 * P + 4 * P / d - acts.none_bytes + max(0, 2 * P - acts.none_bytes) + 2 * head_grad - head_kept
    want = state + gathered + max(acts.working_bytes + max(0, net), head_transient) + L * acts.none_bytes + head_kept
    cm = CostModel(m, shape, lay, cluster, None)
    assert cm.num_micro == 1 and not cm.fsdp_grads_at_peak
    assert cm.rank_memory_bytes(0, [(0, StagePlan(L))], 1) == pytest.approx(want, rel=1e-12)
    # every layer fully recomputed: a layer keeps only its input, less than its unsharded gradients (2 B a
    # parameter), which then count too; its rematerialised activations are the transient's
    assert acts.full_bytes < 2 * P < acts.none_bytes
    net_full = 4 * P + 4 * P / d - acts.full_bytes + (2 * P - acts.full_bytes) + 2 * head_grad - head_kept
    want_full = state + gathered + max(acts.working_bytes + acts.none_bytes + net_full, head_transient) \
        + L * acts.full_bytes + head_kept
    assert cm.rank_memory_bytes(0, [(0, StagePlan(L, L, 0))], 1) == pytest.approx(want_full, rel=1e-12)
    two = CostModel(m, TrainingShape(256, 8), lay, cluster, None)
    assert two.num_micro == 2 and two.fsdp_grads_at_peak
    net2 = net - 4 * P / d
    want2 = state + (L * P + root) * 4 / d + gathered + max(acts.working_bytes + max(0, net2), head_transient) \
        + L * acts.none_bytes + head_kept
    assert two.rank_memory_bytes(0, [(0, StagePlan(L))], 2) == pytest.approx(want2, rel=1e-12)
