"""Fits recover known models; the GEMM grid comes from the catalogue's real shapes; modelled links."""
import random

import pytest

from planner.model import CATALOGUE
from planner.profile import COLLECTIVE_OPS, bus_factor, fit_collective
from runtime.profiler import collectives, modelled, shapes


@pytest.mark.parametrize("op", COLLECTIVE_OPS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_fit_recovers_latency_and_bandwidth(op, n):
    lat, bw = 23e-6, 187e9
    pts = [(s, lat + s * bus_factor(op, n) / bw) for s in (2 ** e for e in range(12, 31))]
    f = fit_collective(pts, op, n, "nvlink")
    assert f.latency_s == pytest.approx(lat, rel=1e-6)
    assert f.bus_bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-6)
    rng = random.Random(0)
    noisy = [(s, t * (1 + rng.uniform(-0.03, 0.03))) for s, t in pts]
    g = fit_collective(noisy, op, n, "nvlink")
    assert g.latency_s == pytest.approx(lat, rel=0.1)
    assert g.bus_bandwidth_bytes_per_s == pytest.approx(bw, rel=0.05)


def test_fit_points_uses_large_messages_and_keeps_all():
    lat, bw = 40e-6, 300e9
    raw = [{"op": "all_reduce", "group_size": 2, "bytes": s,
            "seconds": (lat + s / bw) * (3.0 if s < (1 << 20) else 1.0)}   # small sizes off the line
           for s in (2 ** e for e in range(12, 31))]
    fits, errors = collectives.fit_points(raw, "nvlink")
    (f,) = fits
    assert f.latency_s == pytest.approx(lat, rel=1e-6) and f.bus_bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert len(f.points) == len(raw)
    assert errors["all_reduce/2"]["fit_from_bytes"] == 1 << 20


def test_degenerate_fit_replaced():
    raw = [{"op": "send_recv", "group_size": 2, "bytes": s, "seconds": t}
           for s, t in [(4096, 3e-3), (65536, 2e-3), (1 << 20, 2.5e-3), (4 << 20, 2.2e-3)]]
    fits, errors = collectives.fit_points(raw, "loopback")
    assert errors["send_recv/2"]["degenerate_fit_replaced"]
    assert fits[0].bus_bandwidth_bytes_per_s < 1e12


def test_gemm_grid_from_catalogue():
    spec = shapes.gpu_grid_spec(quick=False)
    grid = shapes.gemm_grid(spec)
    keys = {s.key for s in grid}
    assert len(keys) == len(grid) <= spec.max_shapes
    assert all(s.flops <= spec.flops_cap for s in grid)
    l70 = CATALOGUE["llama3-70b"]
    q = 8192 // 8 + 2 * 128   # TP8: 8 query heads + 1 KV head each for K and V, head_dim 128
    assert (4096, q, 8192, False) in keys                # QKV forward
    assert (4096, 8192, q, False) in keys                # its dgrad
    assert (q, 8192, 4096, True) in keys                 # its wgrad dY^T X (tokens = reduction, fp32)
    assert (4096, 2 * l70.ffn_hidden // 8, 8192, False) in keys  # gate-up fused, TP8
    assert (8192, 8192, l70.ffn_hidden // 8, False) in keys  # fc2 forward
    # MoE experts: one grouped GEMM over the tokens x top_k routed rows
    assert (8192, 2 * 14336, 4096, False) in keys        # mixtral-8x7b, 4096 tokens, TP1


def test_quick_grid_smaller():
    assert len(shapes.gemm_grid(shapes.gpu_grid_spec(True))) < len(shapes.gemm_grid(shapes.gpu_grid_spec(False)))


def test_modelled_links_labelled():
    base = [fit_collective([(1 << 20, 50e-6), (1 << 30, 3.4e-3)], op, 2, "nvlink") for op in COLLECTIVE_OPS]
    more = modelled.nvswitch_groups(base, 8)
    assert {(f.op, f.group_size) for f in more} == {(op, n) for op in COLLECTIVE_OPS for n in (4, 8)}
    assert not any(f.measured for f in more)
    ar2 = next(f for f in base if f.op == "all_reduce")
    ar8 = next(f for f in more if f.op == "all_reduce" and f.group_size == 8)
    assert ar8.bus_bandwidth_bytes_per_s == ar2.bus_bandwidth_bytes_per_s
    assert ar8.latency_s == pytest.approx(7 * ar2.latency_s)
    net = modelled.network_links()
    assert all(f.link == "network" and not f.measured and f.bus_bandwidth_bytes_per_s == 50e9 for f in net)


def test_env_forced():
    import os
    collectives.force_env()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


def test_full_grid_measures_three_times_powers_of_two_after_every_power_of_two():
    grid = shapes.gemm_grid(shapes.gpu_grid_spec(quick=False))
    tok = [s.k if s.kind == "wgrad" else s.m for s in grid]
    between = [t & (t - 1) != 0 for t in tok]
    first = between.index(True)
    assert not any(between[:first]) and all(between[first:])   # a budget cut thins between the lines first
    gpt = CATALOGUE["gpt-1.3b"]
    assert (3072, 3 * gpt.hidden, gpt.hidden, False) in {s.key for s in grid}   # micro-batch 3 x 1024 tokens, QKV
    assert all(t % 3 == 0 for t, b in zip(tok, between) if b)


def test_fp8_grid_covers_the_dense_layer_gemms_only():
    grid = shapes.fp8_gemm_grid(shapes.gpu_grid_spec(quick=False))
    keys = {(s.m, s.n, s.k) for s in grid}
    gpt = CATALOGUE["gpt-1.3b"]
    assert (1024, 3 * gpt.hidden, gpt.hidden) in keys       # QKV forward at TP1
    assert (1024, gpt.hidden, 3 * gpt.hidden) in keys       # its input gradient
    # fc1's input gradient and fc2's forward are one shape and one kernel (both run A x B^T in _scaled_mm)
    assert (1024, gpt.hidden, gpt.ffn_hidden) in keys
    vocab_n = {s.n for s in grid} | {s.k for s in grid}
    assert 50304 not in vocab_n                                                  # the output layer stays bf16
    assert all(s.kind in ("fp8fwd", "fp8dgrad") and min(s.m, s.n, s.k) % 16 == 0 for s in grid)
    assert {s.m for s in grid} <= {1024, 2048, 4096, 8192, 16384}


def test_model_gemm_shapes_cover_every_micro_batch_and_cp_split():
    from planner.model import tiny_model
    gpt = tiny_model("gpt")   # hidden 64, ffn 128: out_proj is the only 64 x 64 GEMM
    got = shapes.model_gemm_shapes(gpt, 64, (1, 2), cp_degrees=(1, 2), max_micro_batch=3)
    toks = {g.m for g in got if g.kind == "fwd" and g.n == g.k == gpt.hidden}
    assert toks == {32, 64, 96, 128, 192}    # micro-batch 1-3 x 64 tokens, over CP 1 and 2
    assert {g.k for g in got if g.kind == "wgrad"} == toks   # the weight gradients reduce over the tokens
    assert len({g.key for g in got}) == len(got)
    moe = tiny_model("llama", name="tiny-moe", num_experts=4, top_k=2)
    routed = {g.m for g in shapes.model_gemm_shapes(moe, 64, (1,), cp_degrees=(1,), max_micro_batch=3)
              if g.kind != "wgrad" and g.n == moe.hidden and g.k == moe.ffn_hidden}   # the experts' fc2 (one
    # table for forward and dgrad shapes: a dense dgrad of the same (m, n, k) stands for it)
    assert {128, 256, 384} <= routed    # top-2: twice the tokens of micro-batches 1-3
    assert all(g.flops <= 1e6 for g in shapes.model_gemm_shapes(moe, 64, flops_cap=1e6))
