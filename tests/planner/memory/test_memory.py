"""Memory counted by hand for tiny cases: bytes per parameter, activations, in-flight micro-batches,
and a small plan's per-rank total."""
from __future__ import annotations

import itertools

import pytest

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.model import tiny_model
from planner.plan import Layout, StagePlan, TrainingShape


@pytest.mark.parametrize("sharding,d,expected", [
    # bf16 weight 2 + fp32 grad 4 + fp32 master 4 + Adam m, v 8 = 18 bytes unsharded
    ("none", 4, 18.0),
    ("optimizer", 1, 18.0),
    ("optimizer", 4, 2 + 4 + 12 / 4),
    ("optimizer+grads", 4, 2 + (4 + 12) / 4),
    # FSDP2: the fp32 sharded parameter is the master (no bf16 copy), fp32 gradient shard, m and v: 16 bytes
    ("full", 4, 16 / 4),
    ("full", 1, 16.0),
])
def test_bytes_per_param(sharding, d, expected):
    assert mem.bytes_per_param(sharding, d) == expected


@pytest.mark.parametrize("sharding,d,expected", [
    # bf16 main gradients (Layout.grad_dtype): 2 B instead of 4 where the full gradient is kept; ZeRO-2's and
    # FSDP's sharded gradients stay fp32
    ("none", 4, 2 + 2 + 12),
    ("optimizer", 4, 2 + 2 + 12 / 4),
    ("optimizer+grads", 4, 2 + (4 + 12) / 4),
    ("full", 4, 16 / 4),
])
def test_bytes_per_param_with_bf16_gradients(sharding, d, expected):
    assert mem.bytes_per_param(sharding, d, mem.grad_bytes(Layout(grad_dtype="bf16"))) == expected
    lay = Layout(dp=d, sharding=sharding, grad_dtype="bf16")
    assert mem.state_bytes(1000, 0, lay) == 1000 * expected


def test_zero1_reduces_in_place_and_zero2_buckets_follow_the_gradient_precision():
    # ZeRO-1: the reduce-scatter writes each rank's shard of the main-gradient buffer: nothing extra
    assert mem.dp_reduction_transient_bytes(4000, 0, Layout(dp=4, sharding="optimizer")) == 0.0
    # ZeRO-2: three full buckets (and the two largest parameters), 4 or 2 B per element
    for g, nbytes in (("fp32", 4), ("bf16", 2)):
        lay = Layout(dp=4, sharding="optimizer+grads", grad_dtype=g)
        assert mem.dp_reduction_transient_bytes(0, 0, lay, 10, 20, bucket_elems=100) == nbytes * (300 + 20 + 20)


def test_state_bytes_shards_experts_over_expert_data_parallel_ranks():
    lay = Layout(dp=4, ep=2, sharding="optimizer")
    # dense over dp*cp = 4 ranks (9 B), experts over 4 / 2 = 2 ranks (2 + 4 + 6 = 12 B)
    assert mem.state_bytes(100, 10, lay) == 100 * 9 + 10 * 12


def test_megatron_shards_expert_states_over_tp_too():
    # Megatron-Core with expert tensor parallel 1: expert data parallel = TP x DP x CP / EP. TP 2, DP 64, EP 64 (the
    # DeepSeek-V3 run of Megatron-Bridge on 1024 H100): 2 ranks share an expert's states there, 1 in ours
    lay = Layout(tp=2, dp=64, ep=64, sharding="optimizer", grad_dtype="bf16")
    assert mem.expert_shard_ranks(lay) == 1
    assert mem.expert_shard_ranks(lay, over_tp=True) == 2
    # dense over 64 ranks: 2 + 2 + 12 / 64 B; experts: ours 2 + 2 + 12 = 16 B, Megatron's 2 + 2 + 12 / 2 = 10 B
    assert mem.state_bytes(640, 10, lay) == 640 * (4 + 12 / 64) + 10 * 16
    assert mem.state_bytes(640, 10, lay, experts_over_tp=True) == 640 * (4 + 12 / 64) + 10 * 10
    from planner.cost.targets import MEGATRON_FACTORS, OURS, megatron_target
    assert not OURS.expert_states_over_tp
    assert megatron_target({k: 1.0 for k in MEGATRON_FACTORS}).expert_states_over_tp


# tiny GPT: hidden 64, 4 heads, ffn 128, LayerNorm (mean and rstd: 8 B per token), micro-batch 2 x seq 32
SHAPE = TrainingShape(seq_len=32, global_batch=8)


def _acts_by_hand(t: int):
    tokens = 2 * 32
    tok = tokens // t                       # sequence-parallel share of the residual stream
    norms_in = 2 * (2 * 64 + 8) * tok       # two norm inputs (bf16) + their fp32 statistics
    gemm_in = 2 * 2 * 64 * tok              # QKV and fc1 inputs (norm outputs), sequence-sharded
    qkv = 2 * 192 * tok                     # q, k, v of this rank's heads
    attn = 2 * 64 * tok + 4 * 2 * (4 // t) * 32   # attention output + fp32 log-sum-exp per head and row
    mlp = 2 * (128 // t) * tokens * 2       # GELU input and output (column-parallel, full sequence)
    none = norms_in + gemm_in + qkv + attn + mlp
    selective = none - gemm_in - 2 * (128 // t) * tokens   # drops norm outputs and GELU output
    full = 2 * 64 * tok                      # the layer input only
    working = 3 * 2 * 192 * tokens // t      # widest of h, f, qkv (192)
    return none, selective, full, working


@pytest.mark.parametrize("t", [1, 2])
def test_layer_activations_by_hand(t):
    a = mem.layer_activations(tiny_model("gpt"), SHAPE, Layout(tp=t, micro_batch=2))
    none, sel, full, working = _acts_by_hand(t)
    assert (a.none_bytes, a.selective_bytes, a.full_bytes, a.working_bytes) == (none, sel, full, working)
    if t == 1:
        assert (none, sel, full, working) == (100352, 67584, 8192, 73728)
    else:
        assert (none, sel, full, working) == (50176, 33792, 4096, 36864)


def test_ring_attention_output_copy_by_hand():
    """Under CP our ring attention keeps its [b, heads, s, d] output and the output projection a [s, b, heads * d]
    copy: one more attention output (bf16, q_width per token of the rank's sequence share) without recompute;
    selective recompute reruns the core and keeps only the copy."""
    lay = Layout(cp=2, micro_batch=2)
    plain = mem.layer_activations(tiny_model("gpt"), SHAPE, lay)
    ring = mem.layer_activations(tiny_model("gpt"), SHAPE, lay, ring_output_copy=True)
    copy = 2 * 64 * (2 * 32 // 2)  # bf16 x q_width 64 x (micro-batch 2 x 32 tokens / CP 2)
    assert ring.none_bytes - plain.none_bytes == copy
    assert (ring.selective_bytes, ring.full_bytes, ring.working_bytes) == \
        (plain.selective_bytes, plain.full_bytes, plain.working_bytes)


def test_head_transient_is_the_larger_of_the_logits_and_the_weight_gradient():
    """The last stage's transient: the logits (bf16, vocab / tp per token) while their gradient is written, or the
    output layer's bf16 weight-sized gradient (vocab / tp x hidden) during its backward, whichever is larger."""
    m = tiny_model("gpt")  # hidden 64, padded vocabulary 256
    short = TrainingShape(seq_len=16, global_batch=8)  # 2 x 16 = 32 tokens < hidden: the weight gradient
    assert mem.head_activation_bytes(m, short, Layout(micro_batch=2))[1] == 2 * 256 * 64
    assert mem.head_activation_bytes(m, SHAPE, Layout(micro_batch=4))[1] == 2 * 256 * 128  # 128 tokens: the logits
    assert mem.head_activation_bytes(m, SHAPE, Layout(tp=2, micro_batch=1))[1] == 2 * 128 * 64


def test_1f1b_in_flight_table():
    lay = Layout(pp=4)
    # rank r runs pp - r forwards before its first backward; never more than there are micro-batches
    assert [mem.in_flight_micro_batches(r, 0, lay, 8) for r in range(4)] == [4, 3, 2, 1]
    assert [mem.in_flight_micro_batches(r, 0, lay, 2) for r in range(4)] == [2, 2, 2, 1]


def test_interleaved_in_flight_table():
    """pp 4, vpp 2, m 8, Megatron's order: forward k runs chunk (k mod 8) // 4, backward k chunk
    1 - (k mod 8) // 4. Rank 0 runs 2*3 + 4 = 10 warm-up forwards plus one: chunks 0,0,0,0,1,1,1,1,0,0,0,
    so at its first backward chunk 0 holds 7 and chunk 1 holds 4; its next forward (k = 11, chunk 0)
    comes while the backwards still drain chunk 1, so chunk 0 reaches 8. Rank 3: 4 warm-up forwards on
    chunk 0 then F(chunk 1) B(chunk 1) x 4, then F(chunk 0) before B(chunk 0): chunk 0 peaks at 5, chunk 1 at 1."""
    lay = Layout(pp=4, vpp=2)
    table = [[mem.in_flight_micro_batches(r, c, lay, 8) for c in range(2)] for r in range(4)]
    assert table == [[8, 4], [8, 4], [7, 3], [5, 1]]
    # m == pp: every forward is warm-up (all chunks hold every micro-batch)
    assert [[mem.in_flight_micro_batches(r, c, lay, 4) for c in range(2)] for r in range(4)] == [[4, 4]] * 4


def _replay(p, v, m, r):
    """Per-chunk peak held micro-batches, replaying the schedule action by action."""
    total = m * v
    warm = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
    fwd = [(k % (p * v)) // p for k in range(total)]
    bwd = [v - 1 - (k % (p * v)) // p for k in range(total)]
    order = [("F", k) for k in range(warm)]
    for i in range(total - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", k) for k in range(total - warm, total)]
    held, peak = [0] * v, [0] * v
    for kind, k in order:
        if kind == "F":
            held[fwd[k]] += 1
        else:
            held[bwd[k]] -= 1
        peak = [max(a, b) for a, b in zip(peak, held)]
    assert held == [0] * v
    return peak


@pytest.mark.parametrize("p,v", [(2, 2), (3, 2), (4, 3), (8, 2), (5, 4)])
def test_interleaved_in_flight_matches_schedule_replay(p, v):
    for m, r in itertools.product([p, 2 * p, 5 * p], range(p)):
        got = [mem.in_flight_micro_batches(r, c, Layout(pp=p, vpp=v), m) for c in range(v)]
        assert got == _replay(p, v, m, r), (p, v, m, r)


def _small_plan_cost():
    m = tiny_model("gpt")
    lay = Layout(pp=2, dp=2, micro_batch=2, sharding="optimizer")
    cluster = ClusterSpec(gpu="cpu", num_gpus=4, gpus_per_node=4)
    return m, lay, CostModel(m, SHAPE, lay, cluster, profile=None)


def test_rank_memory_of_a_small_plan_by_hand():
    """tiny GPT, PP2 DP2 (optimizer sharded over 2: 12 B per parameter), micro-batch 2, 2 micro-batches,
    stages [2 layers] [2 layers, 1 fully recomputed]."""
    m, lay, cm = _small_plan_cost()
    stages = [StagePlan(2), StagePlan(2, full_recompute_layers=1)]
    none, _, full, working = _acts_by_hand(1)
    bpp = 2 + 4 + 12 / 2
    # rank 0: 2 layers + embedding (tokens and positions); 2 micro-batches in flight (1F1B: pp - 0)
    # ZeRO-1 reduces in place (no reduce-scatter outputs): the reduction path at the end of backward is the
    # states and the backward working set alone
    params0 = 2 * 33472 + 256 * 64 + 64 * 64
    # rank 0 also keeps its chunk's output (sent to rank 1) per micro-batch in flight: bf16 tokens x hidden
    out0 = 2 * (2 * 32) * 64
    rank0 = params0 * bpp + working + 2 * (2 * none + out0)
    # rank 1: 2 layers + final norm + its own copy of the tied output layer; 1 micro-batch in flight,
    # holding one plain layer, one recomputed layer's input and the head's kept tensors (final-norm input
    # and output bf16, the bf16 gradient of the logits over the vocabulary); transient: the recomputed
    # layer's activations on top of the backward working set
    head_kept = 2 * 2 * 64 * 64 + 2 * 256 * 64
    params1 = 2 * 33472 + 128 + 256 * 64
    rank1 = params1 * bpp + max((none + full + head_kept) + (working + none), working)
    assert cm.rank_memory_bytes(0, [(0, stages[0])], 2) == rank0
    assert cm.rank_memory_bytes(1, [(1, stages[1])], 2) == rank1


@pytest.mark.parametrize("pp,vpp,sharding", [(2, 1, "none"), (2, 2, "none"), (3, 2, "none"), (2, 1, "optimizer"),
                                             (2, 2, "optimizer")])
def test_memory_terms_agree_with_rank_memory(pp, vpp, sharding):
    """The linear form the search optimises (the rank's memory peak) gives
    the counted memory without full recompute and never less with full recompute (they add one layer's
    activations on top of the largest transient)."""
    m = tiny_model("gpt", num_layers=12)
    dp = 2 if sharding == "optimizer" else 1
    lay = Layout(pp=pp, vpp=vpp, dp=dp, micro_batch=2, sharding=sharding)
    cm = CostModel(m, TrainingShape(32, 2 * 2 * pp * dp), lay,
                   ClusterSpec(gpu="cpu", num_gpus=pp * dp, gpus_per_node=pp * dp), None)
    num_micro = 2 * pp
    for r in range(pp):
        terms = cm.memory_terms(r, num_micro)
        js = list(range(r, pp * vpp, pp))
        for counts in itertools.product([1, 2, 3], repeat=vpp):
            for full, sel in [([0] * vpp, [0] * vpp), ([0] * vpp, list(counts)), ([1] + [0] * (vpp - 1), [0] * vpp),
                              (list(counts), [0] * vpp)]:
                sts = [(j, StagePlan(n, f, s)) for j, n, f, s in zip(js, counts, full, sel)]
                exact = cm.rank_memory_bytes(r, sts, num_micro)
                linear = terms.bytes(counts, full, sel)
                if any(full):
                    assert linear >= exact - 1e-6
                else:
                    assert linear == pytest.approx(exact)


def test_memory_limit_allowance():
    # (capacity - 2.5 GiB reserved) * 95%
    assert mem.memory_limit_bytes(80.0) == pytest.approx((80 - 2.5) * 0.95 * 2**30)


def test_cublas_workspaces_are_counted_inside_the_allocator():
    """32 MiB each, two per rank for an eager step and four for a CUDA-graph step, on GPUs only."""
    model, shape, st = tiny_model("gpt"), TrainingShape(32, 4), [StagePlan(layers=4)]

    def rank0(gpu, graph):
        cm = CostModel(model, shape, Layout(micro_batch=2, sharding="none", cuda_graph=graph),
                       ClusterSpec(gpu=gpu, num_gpus=1, gpus_per_node=1), None)
        return cm.rank_memory_bytes(0, [(0, st[0])], 2)

    assert rank0("h200-sxm", False) - rank0("cpu", False) == 2 * 32 * 2**20
    assert rank0("h200-sxm", True) - rank0("h200-sxm", False) == 2 * 32 * 2**20
    assert rank0("cpu", True) == rank0("cpu", False)


def test_tp_gradient_reduction_is_priced_per_tensor_by_hand():
    """moe at TP2: each replicated tensor's fp32 gradient all-reduced once per step (every micro-batch under
    'optimizer+grads'), at the profile's all-reduce price."""
    from planner.cluster import ClusterSpec
    from planner.cost import CostModel
    from planner.model import tiny_model
    from planner.plan import Layout, TrainingShape
    from planner.profile import load_profile
    spec = tiny_model("llama", num_experts=4, top_k=2)
    prof = load_profile("h200-sxm", "h200-sxm")
    h, f, L = spec.hidden, spec.ffn_hidden, spec.num_layers
    tensors = [(2 * L, h), (L, 4 * h), (3 * 4 * L, f * h), (1, h)]   # norms, routers, experts, final norm
    ar = lambda elems: prof.collective_s("all_reduce", 4 * elems, 2, "nvlink")  # noqa: E731
    want = sum(n * ar(e) for n, e in tensors) * prof.eff("tp")
    for sharding, calls in (("optimizer", 1), ("optimizer+grads", 4)):
        lay = Layout(tp=2, micro_batch=1, sharding=sharding)
        cm = CostModel(spec, TrainingShape(spec.default_seq_len, 4), lay, ClusterSpec(gpu="h200-sxm", num_gpus=2,
                                                                                      gpus_per_node=2), prof)
        assert cm.tp_grad_reduce_s(L, True, True, 4) == pytest.approx(calls * want)
    lay1 = Layout(tp=1, dp=2, micro_batch=1)
    cm1 = CostModel(spec, TrainingShape(spec.default_seq_len, 4), lay1, ClusterSpec(gpu="h200-sxm", num_gpus=2,
                                                                                    gpus_per_node=2), prof)
    assert cm1.tp_grad_reduce_s(L, True, True, 4) == 0.0


@pytest.mark.parametrize("latent", [0, 24])
def test_fp8_cached_activations_by_hand(latent):
    """DeepSeek-V3's storage (memory.Fp8ActivationCache): per token of a tiny MoE (hidden 64, 4 heads of 16, 8
    experts top 2, expert FFN 128, one shared expert of FFN 32) at micro-batch 2 x seq 32: the two norm inputs in
    bf16 without statistics, q/k/v in bf16 or the MLA latents, the attention output in 1.5 B with an fp32
    log-sum-exp per head, the router's fp32 logits and probabilities, per routed copy the FP8 expert input (64) and
    SwiGLU input (256) and the bf16 expert output (64 x 2), the shared expert's FP8 SwiGLU input (64)."""
    m = tiny_model("llama", num_kv_heads=4, num_experts=8, top_k=2, shared_expert_ffn=32)
    lay = Layout(micro_batch=2)
    a = mem.fp8_cached_layer_activations(m, SHAPE, lay, mem.Fp8ActivationCache(mla_latent_width=latent))
    tokens = 2 * 32
    per_token = (2 * 2 * 64 + 2 * (latent or 192) + 1.5 * 64 + 4 * (2 * 8 + 2 * 2 * 8)
                 + 2 * (64 + 256 + 2 * 64) + 64)
    lse = 4 * 2 * 4 * 32
    assert a.none_bytes == a.selective_bytes == per_token * tokens + lse
    ours = mem.layer_activations(m, SHAPE, lay)
    assert (a.full_bytes, a.working_bytes) == (ours.full_bytes, ours.working_bytes)
    assert a.none_bytes < ours.none_bytes


def test_a_target_with_the_fp8_cache_plans_with_it(profile):
    """The cost model counts a layer's activations by the target's rules (RuntimeTarget.fp8_activation_cache)."""
    from planner.cost.targets import RuntimeTarget

    m = tiny_model("llama", num_experts=8, top_k=2)
    lay = Layout(micro_batch=2, ep=2, dp=2, sharding="optimizer")
    cluster = ClusterSpec(num_gpus=4)
    cache = mem.Fp8ActivationCache()
    shared: dict = {}  # one memo, as a search shares it: the target keeps the two apart
    with_cache = CostModel(m, SHAPE, lay, cluster, profile, shared,
                           target=RuntimeTarget("t", fp8_activation_cache=cache))
    plain = CostModel(m, SHAPE, lay, cluster, profile, shared, target=RuntimeTarget("t"))
    assert with_cache.activations == mem.fp8_cached_layer_activations(m, SHAPE, lay, cache)
    assert plain.activations == mem.layer_activations(m, SHAPE, lay)


def test_state_storage_of_another_optimizer_replaces_ours_under_optimizer_sharding():
    """A runtime target's StateStorage counts its replicated and sharded bytes per parameter, dense over DP x CP
    ranks and experts over their expert-data-parallel ranks; other sharding levels keep ours."""
    storage = mem.StateStorage(weight_bytes=2, grad_bytes=2, sharded_bytes=8)
    lay = Layout(dp=4, cp=2, ep=2, sharding="optimizer", grad_dtype="bf16")
    # dense: 2 + 2 + 8 / 8 = 5 B; experts over 8 / 2 = 4 ranks: 2 + 2 + 8 / 4 = 6 B
    assert mem.state_bytes(100, 10, lay, storage=storage) == 100 * 5 + 10 * 6
    full = Layout(dp=4, sharding="full")
    assert mem.state_bytes(100, 0, full, storage=storage) == mem.state_bytes(100, 0, full) == 100 * 16 / 4


@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 1), (2, 2)])
def test_memory_terms_never_below_rank_memory_under_fsdp(pp, vpp):
    """Under 'full' the linear form counts the activations freed before FSDP2's reduction at the least a layer
    keeps (the stages' recompute is not known to it), so it never gives less than the counted memory, and gives
    the same where every layer is fully recomputed."""
    m = tiny_model("gpt", num_layers=12)
    lay = Layout(pp=pp, vpp=vpp, dp=2, micro_batch=2, sharding="full")
    cm = CostModel(m, TrainingShape(32, 2 * 2 * pp * 2), lay,
                   ClusterSpec(gpu="cpu", num_gpus=pp * 2, gpus_per_node=pp * 2), None)
    num_micro = 2 * pp
    for r in range(pp):
        terms = cm.memory_terms(r, num_micro)
        js = list(range(r, pp * vpp, pp))
        for counts in itertools.product([1, 2, 3], repeat=vpp):
            for full, sel in [([0] * vpp, [0] * vpp), ([0] * vpp, list(counts)), (list(counts), [0] * vpp)]:
                sts = [(j, StagePlan(n, f, s)) for j, n, f, s in zip(js, counts, full, sel)]
                exact = cm.rank_memory_bytes(r, sts, num_micro)
                linear = terms.bytes(counts, full, sel)
                assert linear >= exact - 1e-6
                if full == list(counts):
                    assert linear == pytest.approx(exact)
