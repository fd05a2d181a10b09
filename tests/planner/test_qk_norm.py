"""Qwen3's per-head q/k norms (ModelSpec.qk_norm) in the planner, counted by hand: the activations the runtime's
attention keeps for them and the step time of their elementwise passes (runtime/model.py, Attention.qk_normalize)."""
import copy
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


def _with_rates(prof, **rates):
    extras = copy.deepcopy(prof.extras)
    kernels = extras["elementwise"].get("kernels", extras["elementwise"])
    for name, bytes_per_s in rates.items():
        kernels[name] = {"seconds": 1.0 / bytes_per_s, "bytes": 1.0}
    return replace(prof, extras=extras)


@pytest.mark.parametrize("tp", [1, 2])
def test_cost_of_the_norm_passes_by_hand(tp):
    """Forward: the norms read and write q and k (at the profile's rmsnorm_fwd rate), then the concatenation beside v
    reads and writes the whole qkv output (elementwise bandwidth). Backward: the norms read q, k and their gradients
    and write theirs (rmsnorm_bwd), and the qkv gradient is assembled (a read and a write). Selective recompute reruns
    the forward part. Each pass one kernel launch; all times the calibrated compute factor."""
    prof = _with_rates(load_profile("h200-sxm", "h200-sxm"), rmsnorm_fwd=1e12, rmsnorm_bwd=0.5e12)
    lay = Layout(tp=tp, micro_batch=MB, sharding="none")
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=tp, gpus_per_node=tp)
    with_, without = (CostModel(_qwen3_8b(q), TrainingShape(SEQ, 8), lay, cl, prof).layer for q in (True, False))
    tokens = MB * SEQ
    qk_bytes = 2 * tokens * (4096 + 1024) / tp
    qkv_bytes = 2 * tokens * (4096 + 2 * 1024) / tp
    copy_bytes_per_s = prof.copy_bandwidth_bytes_per_s * prof.elementwise_efficiency
    launch_s = prof.kernel_launch_s
    fwd_s = 2 * qk_bytes / 1e12 + launch_s + 2 * qkv_bytes / copy_bytes_per_s + launch_s
    bwd_s = 3 * qk_bytes / 0.5e12 + launch_s + 2 * qkv_bytes / copy_bytes_per_s + launch_s
    ce = prof.eff("compute")
    assert with_.fwd_compute_s - without.fwd_compute_s == pytest.approx(ce * fwd_s)
    assert with_.bwd_compute_s - without.bwd_compute_s == pytest.approx(ce * bwd_s)
    assert with_.selective_recompute_s - without.selective_recompute_s == pytest.approx(ce * fwd_s)
    assert with_.comm_by_dim_s == without.comm_by_dim_s
