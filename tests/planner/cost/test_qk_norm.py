"""Qwen3's per-head q/k norms (ModelSpec.qk_norm) in the planner, counted by hand: the activations the runtime's
attention keeps for them and the step time of their elementwise passes (runtime/qk_norm.py)."""
from dataclasses import replace

import pytest

from planner import memory as mem
from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.model import CATALOGUE
from planner.plan import Layout, TrainingShape
from planner.profile import load_profile

SEQ, MB = 2048, 2


def _qwen3_8b(qk_norm=True):
    """Qwen3-8B's shape (36 layers of hidden 4096, 32 heads of 128, 8 KV heads, SwiGLU 12288) on Llama 3's spec."""
    return replace(CATALOGUE["llama3-8b"], name="qwen3-8b", num_layers=36, ffn_hidden=12288, vocab_size=151936,
                   rope_theta=1e6, norm_eps=1e-6, qk_norm=qk_norm)


@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (4, 2)])
def test_activations_by_hand(tp, cp):
    """Without recompute the q/k norms keep the whole qkv GEMM output (their inputs are views of it) and an fp32 rstd
    per head: bf16 (q + 2 kv widths) + 4 (heads + kv heads) bytes per token of this rank's sequence shard. Selective
    recompute reruns them inside the checkpointed attention core; full recompute keeps the layer input only."""
    lay = Layout(tp=tp, cp=cp, micro_batch=MB, sharding="none")
    with_, without = (mem.layer_activations(_qwen3_8b(q), TrainingShape(SEQ, 8), lay) for q in (True, False))
    tokens_per_rank = MB * SEQ / cp / tp
    extra_bytes = (2 * (4096 + 2 * 1024) + 4 * (32 + 8)) * tokens_per_rank
    assert with_.none_bytes - without.none_bytes == pytest.approx(extra_bytes)
    assert with_.selective_bytes == without.selective_bytes
    assert with_.full_bytes == without.full_bytes


@pytest.mark.parametrize("tp", [1, 2])
def test_cost_of_the_norm_passes_by_hand(tp):
    """runtime/qk_norm.py's kernels: forward reads the qkv GEMM output and writes its normalised copy, backward reads
    it and its gradient and writes the input gradient, each at the elementwise bandwidth with one launch. Selective
    recompute reruns the forward. All times the calibrated compute factor."""
    prof = load_profile("h200-sxm", "h200-sxm")
    lay = Layout(tp=tp, micro_batch=MB, sharding="none")
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=tp, gpus_per_node=tp)
    with_, without = (CostModel(_qwen3_8b(q), TrainingShape(SEQ, 8), lay, cl, prof).layer for q in (True, False))
    tokens = MB * SEQ
    qkv_bytes = 2 * tokens * (4096 + 2 * 1024) / tp
    copy_bytes_per_s = prof.copy_bandwidth_bytes_per_s * prof.elementwise_efficiency
    launch_s = prof.kernel_launch_s
    fwd_s = 2 * qkv_bytes / copy_bytes_per_s + launch_s
    bwd_s = 3 * qkv_bytes / copy_bytes_per_s + launch_s
    ce = prof.eff("compute")
    assert with_.fwd_compute_s - without.fwd_compute_s == pytest.approx(ce * fwd_s)
    assert with_.bwd_compute_s - without.bwd_compute_s == pytest.approx(ce * bwd_s)
    assert with_.selective_recompute_s - without.selective_recompute_s == pytest.approx(ce * fwd_s)
    assert with_.comm_by_dim_s == without.comm_by_dim_s
