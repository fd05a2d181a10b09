"""FP8 GEMMs (runtime/parallel/fp8.py, torch._scaled_mm, which also runs on CPU): agreement with full precision
within FP8's precision, TP2 against one process, the plan field, the modelled pricing and the device refusal;
the fused (Triton) quantisation against the eager one bit for bit, under Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1 in a worker process; skipped without Triton) and on CUDA where there is one."""
import importlib.util
import warnings

import pytest
import torch

from planner.model import tiny_model
from planner.plan import Layout
from runtime.mesh import single_process_groups
from runtime.parallel import fp8
from tests.runtime.dist_util import run_workers
from tests.runtime.equiv import run_case


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_fp8_gemms_agree_with_full_precision_within_fp8_precision():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 32, 96), torch.randn(48, 96), torch.randn(48)
    y = fp8.linear(x, w, b)
    assert y.shape == (2, 32, 48) and 0 < _rel(y, x @ w.t() + b) < 0.06  # E4M3: 3 mantissa bits
    g = torch.randn(2, 32, 48)
    dx = fp8.input_grad(g, w)
    assert dx.shape == (2, 32, 96) and 0 < _rel(dx, g @ w) < 0.10        # the gradient in E5M2: 2 bits
    # a shape that is not a multiple of 16 runs in full precision, exactly
    x3, w3 = torch.randn(5, 24), torch.randn(8, 24)
    torch.testing.assert_close(fp8.linear(x3, w3, None), x3 @ w3.t())
    torch.testing.assert_close(fp8.input_grad(torch.randn(5, 8), w3).shape, torch.Size([5, 24]))


def test_scaling_uses_the_format_range_and_keeps_zeros_finite():
    q, inv = fp8.quantize(torch.tensor([0.5, -2.0, 1.0]), fp8.E4M3)
    assert float(q.float().abs().max()) == 448.0 and float(inv) == pytest.approx(2.0 / 448.0)
    q, inv = fp8.quantize(torch.zeros(4), fp8.E5M2)
    assert torch.isfinite(inv) and float(q.float().abs().max()) == 0.0


def _bits(q):
    return q.view(torch.uint8)


def _old_input_grad(g, w):
    """input_grad as it was before the transposing quantisation: W^T made contiguous in bf16, then quantised."""
    gq, sg = fp8.quantize_eager(g.reshape(-1, g.shape[-1]), fp8.E5M2)
    wtq, sw = fp8.quantize_eager(w.t().contiguous(), fp8.E4M3)
    return torch._scaled_mm(gq, wtq.t(), scale_a=sg, scale_b=sw, out_dtype=g.dtype).view(*g.shape[:-1], -1)


def _old_linear(x, w):
    xq, sx = fp8.quantize_eager(x.reshape(-1, x.shape[-1]), fp8.E4M3)
    wq, sw = fp8.quantize_eager(w, fp8.E4M3)
    return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=x.dtype).view(*x.shape[:-1], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dgrad_weight_quantised_then_transposed_gives_the_same_bits(dtype):
    """The input-gradient GEMM's weight: quantised as W, its 1-byte result transposed (CPU), or written
    transposed by the kernel (CUDA), instead of W^T made contiguous in bf16 and quantised: amax(W) is
    amax(W^T) and the rest is elementwise, so the bits and the product are those of before."""
    torch.manual_seed(1)
    w, g = torch.randn(48, 96).to(dtype), torch.randn(2, 32, 48).to(dtype)
    wtq, sw = fp8.quantize(w, fp8.E4M3, transpose=True)
    ref, sref = fp8.quantize_eager(w.t().contiguous(), fp8.E4M3)
    assert wtq.shape == (96, 48) and wtq.is_contiguous() and torch.equal(_bits(wtq), _bits(ref))
    assert torch.equal(sw, sref)
    assert torch.equal(fp8.input_grad(g, w), _old_input_grad(g, w))
    x = torch.randn(2, 32, 96).to(dtype)
    assert torch.equal(fp8.linear(x, w, None), _old_linear(x, w))


def _all_finite_bf16():
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return every[torch.isfinite(every)].reshape(-1, 16)  # every FP8 binade, its subnormals and ties


def _fused_matches_eager(device) -> list[str]:
    """The fused quantisation (fp8._quantize_triton, both layouts) against quantize_eager, bit for bit, for
    every finite bf16 value at once, a narrower bf16 range, zeros, an fp32 tensor spanning 24 binades and
    random activations; and the FP8 linear / input gradient through it against the eager path. Returns the
    mismatches (empty when all agree)."""
    g = torch.Generator().manual_seed(0)
    cases = {"every finite bf16": _all_finite_bf16(),
             "bf16 crowded near 0": (torch.rand(64, 48, generator=g) * 8) ** 7 / 8 ** 6,
             "zeros": torch.zeros(16, 32),
             "fp32 wide": torch.randn(128, 64, generator=g) * torch.logspace(-20, 3, 64),
             "activations": torch.randn(40, 80, generator=g)}
    bad = []
    for name, x in cases.items():
        x = (x if name.startswith("fp32") else x.to(torch.bfloat16)).to(device)
        for fmt in (fp8.E4M3, fp8.E5M2):
            want, inv = fp8.quantize_eager(x, fmt)
            got, got_inv = fp8._quantize_triton(x, fmt, False)
            got_t, got_t_inv = fp8._quantize_triton(x, fmt, True)
            if not (torch.equal(_bits(got), _bits(want)) and torch.equal(got_inv, inv)):
                bad.append(f"{name} {fmt}: {int((_bits(got) != _bits(want)).sum())} of {x.numel()} differ")
            if not (torch.equal(_bits(got_t), _bits(want.t().contiguous())) and torch.equal(got_t_inv, inv)):
                bad.append(f"{name} {fmt} transposed")
    x, w, gy = (torch.randn(*shape, generator=g).to(torch.bfloat16).to(device)
                for shape in ((2, 32, 96), (48, 96), (2, 32, 48)))
    assert fp8._fused_failed is None
    if not torch.equal(fp8.linear(x, w, None), _old_linear(x, w)):
        bad.append("linear")
    if not torch.equal(fp8.input_grad(gy, w), _old_input_grad(gy, w)):
        bad.append("input_grad")
    assert fp8._fused_failed is None, fp8._fused_failed
    return bad


def _interpreted_fused(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    return _fused_matches_eager("cpu")


def test_fused_quantisation_gives_the_eager_bits_interpreted(monkeypatch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from tests.runtime.dist_util import run_workers
    assert run_workers(_interpreted_fused, 1) == []


@pytest.mark.skipif(not torch.cuda.is_available() or fp8.check_fp8_device("cuda") is not None,
                    reason="the fused FP8 quantisation runs on CUDA GPUs with FP8 (compute capability 8.9+)")
def test_fused_quantisation_gives_the_eager_bits_on_cuda():
    assert _fused_matches_eager("cuda") == []


def test_a_failing_fused_quantisation_falls_back_to_eager_with_one_warning(monkeypatch):
    def broken(x, dtype, transpose):
        raise RuntimeError("no kernel today")

    monkeypatch.setattr(fp8, "use_triton", lambda device: True)
    monkeypatch.setattr(fp8, "_quantize_triton", broken)
    monkeypatch.setattr(fp8, "_fused_failed", None)
    x = torch.randn(32, 48)
    with pytest.warns(UserWarning, match="fused FP8 quantisation failed.*no kernel today") as caught:
        q, inv = fp8.quantize(x, fp8.E4M3)
    assert len(caught) == 1 and "no kernel today" in fp8._fused_failed
    ref, ref_inv = fp8.quantize_eager(x, fp8.E4M3)
    assert torch.equal(_bits(q), _bits(ref)) and torch.equal(inv, ref_inv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qt, _ = fp8.quantize(x, fp8.E4M3, transpose=True)  # no second warning
    assert torch.equal(_bits(qt), _bits(ref.t().contiguous()))


def _fp8_reference(family):
    spec = tiny_model(family)
    return run_case(spec, Layout(sharding="none", micro_batch=2, fp8=True), single_process_groups(), ["none"] * 4)


def test_fp8_training_tracks_full_precision():
    spec = tiny_model("llama")
    full = run_case(spec, Layout(sharding="none", micro_batch=2), single_process_groups(), ["selective"] * 4, steps=3)
    low = run_case(spec, Layout(sharding="none", micro_batch=2, fp8=True), single_process_groups(), ["selective"] * 4,
                   steps=3)
    for a, b in zip(full[0], low[0]):
        assert abs(a - b) < 0.01 * abs(a), (full[0], low[0])
    assert full[0] != low[0]  # the FP8 path did run
    worst = max(_rel(low[1][n], full[1][n]) for n in full[1] if full[1][n].norm() > 0)
    assert worst < 0.15


def _worker(rank, world, cases):
    from planner.model import tiny_model as tm
    from runtime.mesh import build_groups
    out = []
    for family, lay_kw in cases:
        lay = Layout(**lay_kw)
        out.append(run_case(tm(family), lay, build_groups(lay, "cpu"), ["none"] * 4))
    return out


def test_tp2_fp8_matches_one_process_fp8_within_fp8_precision():
    # each TP rank scales its own weight shard and its own input: not bit-identical to one process
    cases = [("gpt", dict(tp=2, micro_batch=2, sharding="none", fp8=True))]
    (got,) = run_workers(_worker, 2, cases)
    ref = _fp8_reference("gpt")
    for a, b in zip(ref[0], got[0]):
        assert abs(a - b) < 0.01 * abs(a)
    worst = max(_rel(got[1][n], ref[1][n]) for n in ref[1] if ref[1][n].norm() > 0)
    assert worst < 0.15


def test_gpu_without_fp8_tensor_cores_is_refused_in_one_sentence(monkeypatch):
    assert fp8.check_fp8_device("cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100-SXM4-80GB")
    why = fp8.check_fp8_device(torch.device("cuda", 0))
    assert "compute capability 8.9" in why and "A100" in why and "\n" not in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert fp8.check_fp8_device(torch.device("cuda", 0)) is None


def test_planner_prices_fp8_and_says_it_is_modelled(tmp_path):
    """A profile without an FP8 table (the shipped one has one: its table is dropped here)."""
    from dataclasses import replace

    from planner.cluster import ClusterSpec
    from planner.model import resolve_model
    from planner.plan import Plan, TrainingShape
    from planner.profile import FP8_GEMM_SPEEDUP, load_profile
    from planner.search import Pins, search

    prof = replace(load_profile("h200-sxm", "h200-sxm"), fp8_points=[])
    # compute-bound: at most FP8_GEMM_SPEEDUP faster; the scaling passes keep it from reaching that exactly
    big = prof.gemm_s(16384, 8192, 8192)
    assert big / FP8_GEMM_SPEEDUP < prof.fp8_gemm_s(16384, 8192, 8192) < big
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=8, gpus_per_node=8)
    model, shape = resolve_model("gpt-13b"), TrainingShape(2048, 256)
    bf16 = search(model, shape, cluster, prof, Pins(tp=2, pp=1, micro_batch=2), top_k=1).plans[0]
    low = search(model, shape, cluster, prof, Pins(tp=2, pp=1, micro_batch=2, fp8=True), top_k=1).plans[0]
    assert low.layout.fp8 and not bf16.layout.fp8 and "FP8" in low.layout.short()
    assert low.prediction.step_s < bf16.prediction.step_s
    assert any("fp8 GEMMs: modelled" in m for m in low.provenance["modelled"])
    assert not any("fp8" in m for m in bf16.provenance["modelled"])
    path = tmp_path / "p.json"
    low.save(path)
    assert Plan.load(path).layout.fp8


def test_a_measured_fp8_table_replaces_the_model_and_the_provenance_note():
    from dataclasses import replace

    from planner.profile import Profile, load_profile
    from planner.search import plan_provenance

    shipped = load_profile("h200-sxm", "h200-sxm")
    assert shipped.fp8_points and not any("fp8" in m for m in plan_provenance(shipped, fp8=True)["modelled"])
    prof = replace(shipped, fp8_points=[])
    modelled = prof.fp8_gemm_s(4096, 4096, 4096)
    measured = replace(prof, fp8_points=[(4096, 4096, 4096, 1.234e-4), (8192, 4096, 4096, 2.4e-4)])
    back = Profile.from_dict(measured.to_dict())
    assert back.fp8_points == measured.fp8_points and back.fp8_measured
    assert back.fp8_gemm_s(4096, 4096, 4096) == pytest.approx(1.234e-4 + 5e-6) != modelled
    assert not any("fp8" in m for m in plan_provenance(back, fp8=True)["modelled"])
    assert any("fp8" in m for m in plan_provenance(prof, fp8=True)["modelled"])


def test_fp8_accuracy_check_holds_out_shapes_and_skips_without_a_table(tmp_path, monkeypatch):
    """benchmarks/profile_accuracy.py's FP8 part: shapes outside the table, timed through the runtime's FP8
    path on CPU (torch._scaled_mm), compared with Profile.fp8_gemm_s."""
    import sys
    from dataclasses import replace
    from pathlib import Path

    from planner.profile import load_profile

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import profile_accuracy as pa

    prof = replace(load_profile("h200-sxm", "h200-sxm"), fp8_points=[])   # the shipped one has a table
    assert "skipped" in pa.bench_fp8(prof, torch.device("cpu"), 3, tmp_path)
    table = [(1024, 6144, 2048, 1e-5), (1536, 6144, 2048, 1.4e-5)]
    held = pa.held_out_fp8_gemms(replace(prof, fp8_points=table), 200)
    assert held and not {(s.m, s.n, s.k) for s in held} & {(m, n, k) for m, n, k, _ in table}
    small = replace(prof, fp8_points=table)
    from runtime.profiler.shapes import GemmShape
    tiny = [GemmShape(64, 128, 64, "fp8fwd"), GemmShape(64, 64, 128, "fp8dgrad")]  # CPU FP8 is slow: time tiny ones
    monkeypatch.setattr(pa, "held_out_fp8_gemms", lambda p, n, seed=0: tiny)
    out = pa.bench_fp8(small, torch.device("cpu"), 2, tmp_path)
    assert out["n"] == 2 and (tmp_path / "fp8.csv").exists()
