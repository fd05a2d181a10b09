"""torchtitan's Llama block run eagerly (RuntimeTarget.eager_llama_elementwise, planner/cost/eager_ops.py): its
elementwise kernels' bytes counted by hand for a tiny layer, each priced at the profile's memory-bound rate with one
launch, the rest of the layer untouched, and only the published row that ran without torch.compile given the trait."""
from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.cost.eager_ops import LlamaBlockShape, torchtitan_llama_block_kernels
from planner.cost.targets import load_target
from planner.errors import PlanError
from planner.model import CATALOGUE, resolve_model
from planner.plan import Layout, TrainingShape
from tests.planner.conftest import REPO

SEQ, MB = 32, 2
H, HEADS, KV_HEADS, FFN = 64, 4, 2, 160
HEAD_DIM = H // HEADS


def _tiny_llama():
    return replace(CATALOGUE["llama3-8b"], name="tiny-llama", num_layers=2, hidden=H, num_heads=HEADS,
                   num_kv_heads=KV_HEADS, ffn_hidden=FFN, vocab_size=1024, max_seq_len=SEQ, default_seq_len=SEQ)


def _hand_bytes(tp: int) -> tuple[float, float, float, int, int, int]:
    """(forward, backward, recompute) bytes and kernel counts of the tiny block on one of `tp` ranks, from the ops
    of torchtitan's code, per element (bf16 2 B, fp32 4 B, complex64 8 B):
    RMSNorm forward: .float() 2+4, pow 4+4, mean 4 (+4 a row), + eps and rsqrt 8 + 8 a row, x * rstd 4+4 (+4 a
    row), type_as 4+2, * weight 2+2 (+2 a weight element): 36 an element, 24 a row, 2 a weight element, 8 kernels.
    RMSNorm backward: g * weight 2+2 (+2 a weight element), g * y 4+2, its sum over rows 2 (+2 a weight element),
    type_as's cast 2+4, g * rstd 4+4 (+4 a row), g * x 8+4, its sum 4 (+4 a row), rsqrt's backward 28 a row (3
    kernels on [rows, 1]), mean's expand / n 4 (+4 a row), pow's x.pow(1) 4+4, 2 * that 4+4, g * that 8+4,
    the two x_f gradients added 8+4, .float()'s cast 4+2: 92 an element, 40 a row, 4 a weight element, 16 kernels.
    Rotary of one of q, k: forward cast 2+4, complex multiply 4+4 (+8 a table entry), cast 4+2; backward the
    same three and the table's conjugate (16 a table entry; the multiply reads it, 8): 20 an element, 3 and 4
    kernels. repeat_kv (KV heads -> query heads) of k and v: a copy forward, a sum backward. SwiGLU: silu 2+2,
    product 4+2 forward; the product's two gradients 6 each and silu_backward 6 backward. Residual adds 4+2 each;
    backward accumulates the attention norm's output twice (wq, wk, wv) and the FFN norm's once (w1, w3) over the
    projections' rows, the block's input and h once each over the norms' rows, 6 an element each. Recompute: the
    forward but its last residual add."""
    T = MB * SEQ
    n, r = T / tp, T  # norms' rows (sequence parallel), projections' rows
    q, kv, f = H // tp, max(KV_HEADS // tp, 1) * HEAD_DIM, FFN // tp
    table = SEQ * HEAD_DIM / 2
    norm_f, norm_b = 36 * n * H + 24 * n + 2 * H, 92 * n * H + 40 * n + 4 * H
    rot = 20 * r * (q + kv)
    rep = 2 * (2 * r * kv + 2 * r * q)
    fwd = 2 * norm_f + rot + 2 * 8 * table + rep + 2 * 6 * n * H + 10 * r * f
    bwd = 2 * norm_b + rot + 2 * 24 * table + rep + 18 * r * f + 3 * 6 * r * H + 2 * 6 * n * H
    kernels_f = 2 * 8 + 2 * 3 + 2 + 2 + 2
    kernels_b = 2 * 16 + 2 * 4 + 2 + 3 + 3 + 2
    return fwd, bwd, fwd - 6 * n * H, kernels_f, kernels_b, kernels_f - 1


@pytest.mark.parametrize("tp", [1, 2])
def test_block_bytes_by_hand(tp):
    fwd, bwd, rec, kf, kb, kr = _hand_bytes(tp)
    T = MB * SEQ
    k = torchtitan_llama_block_kernels(LlamaBlockShape(
        norm_rows=T / tp, proj_rows=T, hidden=H, q_width=H // tp, kv_width=max(KV_HEADS // tp, 1) * HEAD_DIM,
        ffn_width=FFN // tp, rotary_entries=SEQ * HEAD_DIM / 2))
    assert sum(x.nbytes for x in k.forward) == pytest.approx(fwd)
    assert sum(x.nbytes for x in k.backward) == pytest.approx(bwd)
    assert sum(x.nbytes for x in k.recompute) == pytest.approx(rec)
    assert (len(k.forward), len(k.backward), len(k.recompute)) == (kf, kb, kr)


@pytest.mark.parametrize("tp", [1, 2])
def test_each_kernel_at_the_memory_bound_rate_with_a_launch(profile, tp):
    """The layer's elementwise terms under the trait: its bytes at the profile's elementwise bandwidth plus one
    launch a kernel; the layer's compute changes by them (times the calibrated compute factor) and nothing else."""
    fwd, bwd, rec, kf, kb, kr = _hand_bytes(tp)
    rate = profile.copy_bandwidth_bytes_per_s * profile.elementwise_efficiency
    launch = profile.kernel_launch_s
    megatron = load_target("megatron")
    args = (_tiny_llama(), TrainingShape(SEQ, 8), Layout(tp=tp, micro_batch=MB, sharding="none"),
            ClusterSpec(gpu="h200-sxm", num_gpus=tp, gpus_per_node=tp), profile)
    eager = CostModel(*args, target=replace(megatron, eager_llama_elementwise=True))
    fused = CostModel(*args, target=megatron)
    ew = eager._elementwise_s()
    assert ew == pytest.approx((fwd / rate + kf * launch, bwd / rate + kb * launch, rec / rate + kr * launch))
    ce = megatron.kernel_s(profile.eff("compute"))
    fused_ew = fused._elementwise_s()
    e, u = eager.layer, fused.layer
    assert e.fwd_compute_s - u.fwd_compute_s == pytest.approx(ce * (ew[0] - fused_ew[0]))
    assert e.bwd_compute_s - u.bwd_compute_s == pytest.approx(ce * (ew[1] - fused_ew[1]))
    assert e.selective_recompute_s - u.selective_recompute_s == pytest.approx(ce * (ew[2] - fused_ew[2]))
    assert e.comm_by_dim_s == u.comm_by_dim_s


def test_off_by_default_and_the_fused_kernels_kept(profile):
    """Without the trait (every target's default) the elementwise terms are the fused kernels' at the profile's
    measured rates: Llama 3 8B's norms, SwiGLU and rotary priced by name (rmsnorm_fwd, swiglu_fwd, rotary_fwd...)."""
    megatron = load_target("megatron")
    assert not megatron.eager_llama_elementwise and not load_target("ours").eager_llama_elementwise
    cm = CostModel(resolve_model("llama3-8b"), TrainingShape(8192, 16), Layout(micro_batch=2, sharding="none"),
                   ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1), profile, target=megatron)
    k = profile.kernel_s
    T, h, f, qkv = 2 * 8192, 4096, 14336, 4096 + 2 * 1024
    row = 2 * T * h
    fwd = k("rmsnorm_fwd", 2 * row) + k("rmsnorm_add_fwd", 4 * row) + k("residual_add", 3 * row) \
        + k("swiglu_fwd", 2 * 3 * T * f) + k("rotary_fwd", 2 * 2 * T * qkv)
    bwd = 2 * k("rmsnorm_bwd", 4 * row) + k("swiglu_bwd", 2 * 5 * T * f) + k("rotary_bwd", 2 * 2 * T * qkv)
    sel = 2 * k("rmsnorm_fwd", 2 * row) + k("swiglu_fwd", 2 * 3 * T * f)
    assert cm._elementwise_s() == pytest.approx((fwd, bwd, sel))


def test_trait_refused_for_a_layer_it_does_not_describe(profile):
    cm = CostModel(resolve_model("gpt-1.3b"), TrainingShape(2048, 8), Layout(micro_batch=1, sharding="none"),
                   ClusterSpec(gpu="h200-sxm", num_gpus=1, gpus_per_node=1), profile,
                   target=replace(load_target("megatron"), eager_llama_elementwise=True))
    with pytest.raises(PlanError, match="not a dense Llama layer"):
        cm._elementwise_s()


def test_only_the_row_run_without_torch_compile_gets_the_trait():
    """torchtitan's Table 3 row 'FSDP' ran without torch.compile; its other rows (and every other source) did not
    run torchtitan eagerly."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import published_rows
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    megatron = load_target("megatron")
    eager = {r.row_id for r in published_rows.load_rows()
             if published_rows.row_target(r, megatron).eager_llama_elementwise}
    assert eager == {"titan24-01"}
