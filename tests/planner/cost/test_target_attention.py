"""How the runtime targets price the attention core and context parallelism (planner/cost/targets.py,
planner/cost/layer.py): the attention factors, FlashAttention-2's ratio file, PyTorch's and Llama 3's all-gather
context parallel with their fp32 passes, and Megatron-LM's unfused core, each by hand."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.cost.targets import OURS, RuntimeTarget, load_target
from planner.cost.layer import torch_cp_fp32_pass_bytes
from planner.cost.terms import exposed_s
from planner.errors import PlanError
from planner.model import resolve_model
from tests.planner.cost.test_runtime_target import _cost

def test_attention_factors_scale_only_the_attention_core(profile):
    """A target whose attention kernel is slower (RuntimeTarget.attention_fwd_factor / _bwd_factor) adds exactly the
    extra attention time to the layer, forward and backward, and nothing else."""
    kw, seq_gb = dict(micro_batch=1, cuda_graph=False), (4096, 8)
    base = _cost(profile, "llama3-8b", 1, kw, seq_gb, RuntimeTarget("t")).layer
    slow = _cost(profile, "llama3-8b", 1, kw, seq_gb,
                 RuntimeTarget("t", attention_fwd_factor=1.5, attention_bwd_factor=2.0)).layer
    m = resolve_model("llama3-8b")
    attn = [profile.attention_s(1, m.num_heads, 4096, 4096, m.head_dim, True, bwd) * profile.eff("compute")
            for bwd in (False, True)]
    assert slow.fwd_compute_s - base.fwd_compute_s == pytest.approx(0.5 * attn[0], rel=1e-9)
    assert slow.bwd_compute_s - base.bwd_compute_s == pytest.approx(1.0 * attn[1], rel=1e-9)
    assert slow.selective_recompute_s - base.selective_recompute_s == pytest.approx(0.5 * attn[0], rel=1e-9)


def test_fa2_ratio_file_is_read_and_checked(tmp_path):
    from planner.cost.targets import attention_fa2

    shipped = attention_fa2(load_target("megatron"))
    assert shipped.attention_fwd_factor > 1 and shipped.attention_bwd_factor > 1  # FA2 is slower than cuDNN's
    assert shipped.compute_factor == load_target("megatron").compute_factor
    p = tmp_path / "fa2.json"
    p.write_text(json.dumps({"fa2_over_runtime_fwd": 1.25, "fa2_over_runtime_bwd": 1.5}))
    t = attention_fa2(OURS, p)
    assert (t.attention_fwd_factor, t.attention_bwd_factor) == (1.25, 1.5)
    for bad in ("{", json.dumps({"fa2_over_runtime_fwd": 1.2}), json.dumps({"fa2_over_runtime_fwd": 50,
                                                                            "fa2_over_runtime_bwd": 1})):
        p.write_text(bad)
        with pytest.raises(PlanError) as e:
            attention_fa2(OURS, p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(PlanError, match="missing"):
        attention_fa2(OURS, tmp_path / "absent.json")


def test_all_gather_context_parallel_by_hand(profile):
    """PyTorch's all-gather CP (RuntimeTarget.cp_kv_all_gather, cp_kv_expanded): the forward's one gather of every
    rank's expanded K and V hides only behind the local block; the backward gathers again the same way and passes
    dK, dV one ring step beside each of the other blocks."""
    kw, seq_gb = dict(cp=4, micro_batch=1, cuda_graph=False), (32768, 4)
    t = RuntimeTarget("t", cp_kv_expanded=True, cp_kv_all_gather=True)
    cm = _cost(profile, "llama3-8b", 4, kw, seq_gb, t)
    m, L = resolve_model("llama3-8b"), cm.layer
    kv_bytes = 2 * 2 * m.num_heads * (32768 // 4) * m.head_dim  # bf16 K and V with the query heads
    gather = cm.group_collective_s("all_gather", 4 * kv_bytes, 4, cm.strides["cp"]) * profile.eff("cp")
    step = cm.group_collective_s("send_recv", kv_bytes, 4, cm.strides["cp"]) * profile.eff("cp")
    frac = profile.overlap_hidden_fraction.get("cp", 0.0)
    ring = profile.eff("ring") * profile.eff("compute")
    attn_f, attn_b = (ring * profile.attention_s(1, m.num_heads, 8192, 32768, m.head_dim, True, bwd)
                      for bwd in (False, True))
    want = exposed_s(gather, attn_f / 4, frac, True) + exposed_s(gather, attn_b / 4, frac, True) \
        + exposed_s(3 * step, attn_b * 3 / 4, frac, True)
    assert L.comm_by_dim_s["cp"] == pytest.approx(want, rel=1e-9)
    # the ring of K/V heads (ours) moves kv_heads / heads of those bytes
    ours = _cost(profile, "llama3-8b", 4, kw, seq_gb, RuntimeTarget("t")).layer.comm_by_dim_s["cp"]
    assert ours < L.comm_by_dim_s["cp"]


def test_torch_context_parallel_fp32_buffers_by_hand(profile):
    """PyTorch 2.6's context_parallel (RuntimeTarget.cp_fp32_buffers): dK, dV pass through all 4 ranks in fp32, the
    last step exposed whole, and its fp32 merges and accumulators add memory-bound passes to the attention."""
    kw, seq_gb = dict(cp=4, micro_batch=1, cuda_graph=False), (32768, 4)
    base = RuntimeTarget("t", cp_kv_expanded=True, cp_kv_all_gather=True)
    cm = _cost(profile, "llama3-8b", 4, kw, seq_gb, replace(base, cp_fp32_buffers=True))
    plain = _cost(profile, "llama3-8b", 4, kw, seq_gb, base)
    m = resolve_model("llama3-8b")
    elems = m.num_heads * (32768 // 4) * m.head_dim  # output and expanded K (or V) alike
    # by hand, n = 4: forward 6 x 3.25 + 32 x 2.25 + 8 x 1.5 + 6 = 109.5 B per output element and 2 x 4 x 4 per K
    # element; backward 4 + 10 x 3.25 + 8 x 1.5 + 6 = 54.5 and 2 x (4 + 72 + 12 + 16 + 6) = 220
    assert torch_cp_fp32_pass_bytes(elems, elems, 4) == (elems * (109.5 + 32), elems * (54.5 + 220))
    ring = profile.eff("ring") * profile.eff("compute")
    attn_f, attn_b = (ring * profile.attention_s(1, m.num_heads, 8192, 32768, m.head_dim, True, bwd)
                      for bwd in (False, True))
    pass_f, pass_b = (profile.memory_bound_s(b) * profile.eff("compute") for b in
                      torch_cp_fp32_pass_bytes(elems, elems, 4))
    assert cm.layer.fwd_compute_s - plain.layer.fwd_compute_s == pytest.approx(pass_f, rel=1e-9)
    assert cm.layer.bwd_compute_s - plain.layer.bwd_compute_s == pytest.approx(pass_b, rel=1e-9)
    kv_bytes = 2 * 2 * elems
    gather = cm.group_collective_s("all_gather", 4 * kv_bytes, 4, cm.strides["cp"]) * profile.eff("cp")
    grad_step = cm.group_collective_s("send_recv", 2 * kv_bytes, 4, cm.strides["cp"]) * profile.eff("cp")
    frac = profile.overlap_hidden_fraction.get("cp", 0.0)
    attn_f, attn_b = attn_f + pass_f, attn_b + pass_b
    want = exposed_s(gather, attn_f / 4, frac, True) + exposed_s(gather, attn_b / 4, frac, True) \
        + exposed_s(3 * grad_step, attn_b * 3 / 4, frac, True) + grad_step
    assert cm.layer.comm_by_dim_s["cp"] == pytest.approx(want, rel=1e-9)
    assert cm.layer.comm_by_dim_s["cp"] > plain.layer.comm_by_dim_s["cp"]
    # K, V with their own (GQA) heads: the passes over K and V take kv_heads / heads of the output's elements
    gqa = _cost(profile, "llama3-8b", 4, kw, seq_gb, RuntimeTarget("t", cp_kv_all_gather=True, cp_fp32_buffers=True))
    gqa_plain = _cost(profile, "llama3-8b", 4, kw, seq_gb, RuntimeTarget("t", cp_kv_all_gather=True))
    kv_elems = m.num_kv_heads * (32768 // 4) * m.head_dim
    pass_f = profile.memory_bound_s(torch_cp_fp32_pass_bytes(elems, kv_elems, 4)[0]) * profile.eff("compute")
    assert gqa.layer.fwd_compute_s - gqa_plain.layer.fwd_compute_s == pytest.approx(pass_f, rel=1e-9)
    # the ring (no all-gather) moves dK, dV in fp32 too, the last step exposed
    ring = _cost(profile, "llama3-8b", 4, kw, seq_gb, RuntimeTarget("t", cp_fp32_buffers=True))
    ring_plain = _cost(profile, "llama3-8b", 4, kw, seq_gb, RuntimeTarget("t"))
    assert ring.layer.comm_by_dim_s["cp"] > ring_plain.layer.comm_by_dim_s["cp"]


def test_exposed_all_gather_context_parallel(profile):
    """Llama 3's CP (cp_kv_all_gather with cp_hidden_fraction 0): every gather and ring step on the critical path,
    K and V with their own heads."""
    kw, seq_gb = dict(cp=4, micro_batch=1, cuda_graph=False), (32768, 4)
    cm = _cost(profile, "llama3-8b", 4, kw, seq_gb, RuntimeTarget("t", cp_kv_all_gather=True, cp_hidden_fraction=0.0))
    m = resolve_model("llama3-8b")
    kv_bytes = 2 * 2 * m.num_kv_heads * (32768 // 4) * m.head_dim
    gather = cm.group_collective_s("all_gather", 4 * kv_bytes, 4, cm.strides["cp"]) * profile.eff("cp")
    step = cm.group_collective_s("send_recv", kv_bytes, 4, cm.strides["cp"]) * profile.eff("cp")
    assert cm.layer.comm_by_dim_s["cp"] == pytest.approx(2 * gather + 3 * step, rel=1e-9)


def test_unfused_attention_core_by_hand(profile):
    """Megatron-LM's unfused core of 2021-22 (RuntimeTarget.unfused_attention): two batched GEMMs each way over the
    whole s x s square (four in backward), 8 bytes of memory-bound passes per score forward and 9 backward, in place
    of the fused kernel; selective recompute reruns it; without recompute the layer keeps 5 bytes per score more
    (Korthikanti et al. 2022 equation 1: 5 a s^2 b per layer, over t with tensor parallelism), which selective
    recompute drops."""
    from planner.cost.layer import UNFUSED_CORE_BWD_BYTES, UNFUSED_CORE_FWD_BYTES

    kw, seq_gb = dict(tp=2, micro_batch=2, sharding="none", cuda_graph=False), (2048, 16)
    fused = _cost(profile, "gpt-1.3b", 2, kw, seq_gb, RuntimeTarget("t"))
    unfused = _cost(profile, "gpt-1.3b", 2, kw, seq_gb, RuntimeTarget("t", unfused_attention=True))
    m = resolve_model("gpt-1.3b")
    a, s, b, t, d = m.num_heads, 2048, 2, 2, m.head_dim
    groups, scores = b * a // t, b * a // t * s * s
    assert (UNFUSED_CORE_FWD_BYTES, UNFUSED_CORE_BWD_BYTES) == (8, 9)

    def g(rows, n, k):
        return profile.gemm_table_s("mm", groups * rows, n, k)
    c = profile.eff("compute")
    core_f = (g(s, s, d) + g(s, d, s) + profile.memory_bound_s(8 * scores)) * c
    core_b = (g(s, s, d) + 2 * g(s, d, s) + g(s, d, s) + profile.memory_bound_s(9 * scores)) * c
    flash_f, flash_b = (profile.attention_s(b, a // t, s, s, d, True, bwd) * c for bwd in (False, True))
    assert unfused.layer.fwd_compute_s - fused.layer.fwd_compute_s == pytest.approx(core_f - flash_f, rel=1e-9)
    assert unfused.layer.bwd_compute_s - fused.layer.bwd_compute_s == pytest.approx(core_b - flash_b, rel=1e-9)
    assert unfused.layer.selective_recompute_s - fused.layer.selective_recompute_s == pytest.approx(
        core_f - flash_f, rel=1e-9)
    assert core_f > 2 * flash_f  # the whole square and its passes: no fused kernel comes close
    kept, kept_fused = unfused.activations, fused.activations
    assert kept.none_bytes - kept_fused.none_bytes == 5 * a * s * s * b / t
    assert kept.selective_bytes == kept_fused.selective_bytes and kept.full_bytes == kept_fused.full_bytes
    assert kept.working_bytes - kept_fused.working_bytes == 9 * a * s * s * b / t
