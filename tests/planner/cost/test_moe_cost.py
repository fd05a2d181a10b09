"""The MoE layer's memory-bound terms (planner/cost/) by hand: the row movements of dispatch and combine, and
the stacked copy of the expert weights, which the runtime makes only where its flat buffers cannot hold each
projection's expert weights back to back (ZeRO-2, FSDP; runtime/parallel/flat_buffer.py)."""
import pytest

from planner.cluster import ClusterSpec
from planner import memory as mem
from planner.cost import BF16, CostModel
from planner.model import resolve_model
from planner.plan import Layout, TrainingShape
from planner.profile import load_profile

PROF = load_profile(None, "h200-sxm")


def _layer(lay, spec):
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
    return CostModel(spec, TrainingShape(2048, 8), lay, cl, PROF).layer


def test_stacked_copy_only_under_zero2():
    spec = resolve_model("mixtral-8x7b")
    base = _layer(Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer"), spec)
    zero2 = _layer(Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer+grads"), spec)
    copy_s = PROF.memory_bound_s(2 * BF16 * mem.layer_expert_params_local(spec, 2)) * PROF.eff("expert")
    assert zero2.fwd_s - base.fwd_s == pytest.approx(copy_s, rel=1e-9)
    assert zero2.bwd_compute_s - base.bwd_compute_s == pytest.approx(copy_s, rel=1e-9)


@pytest.mark.parametrize("ep", [1, 2])
def test_row_passes_by_hand(ep):
    spec = resolve_model("mixtral-8x7b")
    lay = Layout(dp=2, ep=ep, micro_batch=1, sharding="optimizer")
    cm = CostModel(spec, TrainingShape(2048, 8), lay, ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2), PROF)
    tokens, h, k = 2048, spec.hidden, spec.top_k
    routed = tokens * k
    row = 2 * h   # bf16 bytes of one row
    fwd = row * (3 * routed + tokens) + (row * 4 * routed if ep > 1 else 0)   # gather; combine
    bwd = row * (4 * routed + tokens) + (row * 4 * routed if ep > 1 else 0)   # combine's backward; sum of copies
    f, b = cm._moe_row_passes_s(tokens, routed, h, ep > 1)
    assert f == pytest.approx(PROF.memory_bound_s(fwd), rel=1e-12)
    assert b == pytest.approx(PROF.memory_bound_s(bwd), rel=1e-12)


def test_two_chunk_exposure_by_hand():
    """Dispatch 0 alone, dispatch 1 beside experts 0, combine 0 beside experts 1, combine 1 alone."""
    from planner.cost import two_chunk_exposed_s
    assert two_chunk_exposed_s(1.0, 3.0) == pytest.approx(2.0)    # experts hide the middle transfers
    assert two_chunk_exposed_s(3.0, 1.0) == pytest.approx(10.0)   # transfers bound: 4 x 3 - 2 x 1
    assert two_chunk_exposed_s(0.0, 5.0) == 0.0


def test_chunked_dispatch_prices_half_the_rows_twice_and_its_timeline():
    """overlap_ep: the expert GEMMs at half the rows per expert, twice; the all-to-alls of half the bytes exposed as
    two_chunk_exposed_s says, each direction; the rest of the layer as without it."""
    from planner.cost import two_chunk_exposed_s
    spec = resolve_model("mixtral-8x7b")
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=1, inter_node_gb_per_s=25)
    one = CostModel(spec, TrainingShape(2048, 8), Layout(dp=2, ep=2, micro_batch=1), cl, PROF)
    two = CostModel(spec, TrainingShape(2048, 8), Layout(dp=2, ep=2, micro_batch=1, overlap_ep=True), cl, PROF)
    assert (one.dispatch_chunks, two.dispatch_chunks) == (1, 2)
    routed, h, f = 2048 * spec.top_k, spec.hidden, spec.ffn_hidden
    local = spec.num_experts // 2
    assert (one.expert_gemm_rows, two.expert_gemm_rows) == (routed * 2 // 8, routed * 2 // 8 // 2)
    gemms = [(2 * f, h), (h, f)]
    full = [one._grouped_gemm_fwd_bwd_s(local, routed * 2 // 8, n, k) for n, k in gemms]
    half = [two._grouped_gemm_fwd_bwd_s(local, routed * 2 // 8 // 2, n, k) for n, k in gemms]
    eff = PROF.eff("expert")
    d_fwd = sum(2 * hf - ff for (hf, _), (ff, _) in zip(half, full)) * eff
    assert two.layer.fwd_compute_s - one.layer.fwd_compute_s == pytest.approx(d_fwd, rel=1e-9, abs=1e-12)
    a2a = two.group_collective_s("all_to_all", BF16 * routed * h / 2, 2, two.strides["ep"]) * PROF.eff("ep")
    want = two_chunk_exposed_s(a2a, sum(x for x, _ in half) * eff) + two_chunk_exposed_s(a2a, sum(x for _, x in half) * eff)
    assert two.layer.comm_by_dim_s["ep"] == pytest.approx(want, rel=1e-9)


def test_search_chunks_the_dispatch_where_it_pays_and_never_when_told_not_to():
    from planner.search import Pins, search
    spec = resolve_model("mixtral-8x7b")
    slow = ClusterSpec(gpu="h200-sxm", num_gpus=16, gpus_per_node=2, inter_node_gb_per_s=25)
    best = search(spec, TrainingShape(4096, 1024), slow, PROF, Pins(ep=8)).plans[0]
    assert best.layout.overlap_ep   # EP8 across nodes at 25 GB/s: the transfers are worth hiding
    off = search(spec, TrainingShape(4096, 1024), slow, PROF, Pins(ep=8, no_overlap=frozenset({"ep"}))).plans[0]
    assert not off.layout.overlap_ep
    assert off.prediction.step_s > best.prediction.step_s


def test_shared_experts_priced_as_a_dense_swiglu_on_the_sequence_shard():
    """Shared experts add, per layer and direction, their two GEMMs over this rank's tokens (whole on every TP
    rank), the SwiGLU pass and, gated, the gate's passes; everything else of the layer is unchanged."""
    import dataclasses
    base = resolve_model("mixtral-8x7b")
    shared = dataclasses.replace(base, shared_expert_ffn=4096, shared_expert_gate=True)
    lay = Layout(tp=2, dp=2, ep=2, micro_batch=1)
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=4, gpus_per_node=4)
    one, two = (CostModel(s, TrainingShape(2048, 8), lay, cl, PROF) for s in (base, shared))
    tok, h, fs = 2048 // 2, base.hidden, 4096
    g = [two._gemm_fwd_bwd_s(tok, 2 * fs, h), two._gemm_fwd_bwd_s(tok, h, fs)]
    ce = PROF.eff("compute")
    d_fwd = (g[0][0] + g[1][0] + PROF.kernel_s("swiglu_fwd", BF16 * 3 * tok * fs)
             + PROF.memory_bound_s(BF16 * 3 * tok * h)) * ce
    d_bwd = (g[0][1] + g[1][1] + PROF.kernel_s("swiglu_bwd", BF16 * 5 * tok * fs)
             + PROF.memory_bound_s(BF16 * 5 * tok * h)) * ce
    assert two.layer.fwd_compute_s - one.layer.fwd_compute_s == pytest.approx(d_fwd, rel=1e-9)
    assert two.layer.bwd_compute_s - one.layer.bwd_compute_s == pytest.approx(d_bwd, rel=1e-9)
    assert two.layer.comm_by_dim_s == one.layer.comm_by_dim_s
    assert mem.layer_dense_params_local(shared, 2) - mem.layer_dense_params_local(base, 2) == 3 * h * fs + h


def test_layer_memo_tells_stacking_sharding_levels_apart():
    """A search shares layer costs between layouts with the same memo key; ZeRO-2's stacked expert-weight copy
    must not be served to a ZeRO-1 layout (or the reverse) from that memo."""
    spec = resolve_model("mixtral-8x7b")
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2)
    shared = {}
    layers = {}
    for sh in ("optimizer", "optimizer+grads", "optimizer"):
        lay = Layout(dp=2, ep=2, micro_batch=1, sharding=sh)
        layers.setdefault(sh, []).append(CostModel(spec, TrainingShape(2048, 8), lay, cl, PROF, shared).layer.fwd_s)
    fresh = CostModel(spec, TrainingShape(2048, 8), Layout(dp=2, ep=2, micro_batch=1, sharding="optimizer+grads"),
                      cl, PROF).layer.fwd_s
    assert layers["optimizer+grads"] == [fresh] and layers["optimizer"][0] == layers["optimizer"][1] < fresh


QWEN3_MOE = "benchmarks/models/qwen3-30b-a3b/config.json"


@pytest.mark.parametrize("ep, rows", [(1, 256), (2, 512), (8, 2048)])
def test_rows_per_expert_by_hand(ep, rows):
    """Qwen3-30B-A3B (128 experts, top 8), one micro-batch of 4096 tokens on a rank: 4096 x 8 = 32768 routed copies
    a rank, spread over 128 experts at EP 1 (256 each); at EP e a rank holds 128 / e experts and receives the EP
    group's copies for them, 32768 x e / 128 rows each."""
    spec = resolve_model(QWEN3_MOE)
    lay = Layout(dp=8, ep=ep, micro_batch=1)
    cm = CostModel(spec, TrainingShape(4096, 64), lay, ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=8), PROF)
    assert (spec.num_experts, spec.top_k) == (128, 8)
    assert cm.expert_gemm_rows == rows
    assert cm.expert_gemm_rows * spec.num_experts // ep == 4096 * 8   # every routed copy lands on one local expert


@pytest.mark.parametrize("ep", [1, 2, 8])
def test_grouped_gemm_is_local_experts_times_the_small_gemm(ep):
    """Without measured grouped GEMMs in the profile (the fallback; tests/planner/profile/test_grouped_gemm.py has the
    measured path), the local experts' fc1 and fc2 each cost (local experts) x the table time of one expert's GEMM at its rows
    (forward; dgrad + wgrad backward), plus one launch per grouped kernel, not one per expert; the layer's MoE compute
    is the router's GEMM, those grouped GEMMs and the row passes, times the expert efficiency."""
    from dataclasses import replace
    spec = resolve_model(QWEN3_MOE)
    lay = Layout(dp=8, ep=ep, micro_batch=1)
    prof = replace(PROF, grouped_points=[])
    cm = CostModel(spec, TrainingShape(4096, 64), lay, ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=8), prof)
    local, rows, h, f = 128 // ep, 4096 * 8 * ep // 128, spec.hidden, spec.ffn_hidden
    assert f == 768
    launch = PROF.gemm_launch_s
    want_f = want_b = 0.0
    for n, k in ((2 * f, h), (h, f)):
        fwd = PROF.gemm_s(rows, n, k) - launch
        bwd = PROF.gemm_s(rows, k, n) - launch + PROF.wgrad_s(n, k, rows) - launch
        got_f, got_b = cm._grouped_gemm_fwd_bwd_s(local, rows, n, k)
        assert got_f == pytest.approx(local * fwd + launch, rel=1e-12)
        assert got_b == pytest.approx(local * bwd + 2 * launch, rel=1e-12)
        want_f, want_b = want_f + got_f, want_b + got_b
    # the layer's compute holds exactly those grouped GEMMs, times the expert efficiency: the same layer with them
    # priced at nothing differs by that much
    without = CostModel(spec, TrainingShape(4096, 64), lay, ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=8),
                        prof)
    without._grouped_gemm_fwd_bwd_s = lambda *shape: (0.0, 0.0)
    eff = PROF.eff("expert")
    assert cm.layer.fwd_compute_s - without.layer.fwd_compute_s == pytest.approx(want_f * eff, rel=1e-9)
    assert cm.layer.bwd_compute_s - without.layer.bwd_compute_s == pytest.approx(want_b * eff, rel=1e-9)


def test_few_rows_per_expert_cost_more_than_one_dense_gemm():
    """At 256 rows an expert, 128 small GEMMs take longer than one GEMM over all 32768 rows (the optimistic price
    this replaces), and EP 8's 16 experts of 2048 rows take less than EP 1's 128 of 256."""
    spec = resolve_model(QWEN3_MOE)
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=8)
    cms = {ep: CostModel(spec, TrainingShape(4096, 64), Layout(dp=8, ep=ep, micro_batch=1), cl, PROF) for ep in (1, 8)}
    h, f = spec.hidden, spec.ffn_hidden
    one_dense = PROF.gemm_s(4096 * 8, 2 * f, h)
    ep1 = cms[1]._grouped_gemm_fwd_bwd_s(128, 256, 2 * f, h)[0]
    ep8 = cms[8]._grouped_gemm_fwd_bwd_s(16, 2048, 2 * f, h)[0]
    assert ep1 > one_dense and ep8 < ep1
