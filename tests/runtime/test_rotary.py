"""runtime/rotary.py: the qkv split with rotary on q and k, and its backward, against autograd through
runtime/attention.py's apply_rotary in float64: on the PyTorch path, under Triton's interpreter (a worker process
with TRITON_INTERPRET=1) and on CUDA."""

import math

import pytest
import torch

from planner.model import tiny_model
from runtime.attention import apply_rotary, rotary_inv_freq, rotary_tables
from runtime.rotary import qkv_rotary
from tests.runtime.dist_util import run_interpreted


def _reference(qkv, cos, sin, heads, kv_heads):
    s, b, w = qkv.shape
    d = w // (heads + 2 * kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = q.reshape(s, b, heads, d).permute(1, 2, 0, 3)
    k = k.reshape(s, b, kv_heads, d).permute(1, 2, 0, 3)
    v = v.reshape(s, b, kv_heads, d).permute(1, 2, 0, 3)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


def _check(device: str, dtype, s=7, b=3, heads=4, kv_heads=2, d=16) -> list[str]:
    torch.manual_seed(0)
    qkv = torch.randn(s, b, (heads + 2 * kv_heads) * d).to(dtype)
    # positions not from 0: a CP or later-stage shard
    cos, sin = rotary_tables(torch.arange(5, 5 + s), tiny_model("llama", head_dim_override=d))
    grads = [torch.randn(b, n, s, d).to(dtype) for n in (heads, kv_heads, kv_heads)]
    ref_in = qkv.double().requires_grad_(True)
    ref = _reference(ref_in, cos.double(), sin.double(), heads, kv_heads)
    torch.autograd.backward(ref, [g.double() for g in grads])
    dev = torch.device(device)
    x = qkv.to(dev).requires_grad_(True)
    out = qkv_rotary(x, cos.to(dev), sin.to(dev), heads, kv_heads)
    torch.autograd.backward(out, [g.to(dev) for g in grads])
    from runtime.triton_support import use_triton
    fused = use_triton(dev)   # the fused kernel writes contiguous q, k, v (PyTorch's path keeps qkv's strides)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    bad = []
    for name, got, want in zip(("q", "k", "v"), out, ref):
        if got.shape != want.shape or got.dtype != dtype or (fused and not got.is_contiguous()):
            bad.append(f"{name}: {tuple(got.shape)} {got.dtype} contiguous={got.is_contiguous()}")
        elif not torch.allclose(got.cpu().double(), want, rtol=tol, atol=tol):
            bad.append(f"{name} {dtype}: max error {(got.cpu().double() - want).abs().max():.3g}")
    if not torch.allclose(x.grad.cpu().double(), ref_in.grad, rtol=tol, atol=tol):
        bad.append(f"dqkv {dtype}: max error {(x.grad.cpu().double() - ref_in.grad).abs().max():.3g}")
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_path_matches_apply_rotary(dtype):
    assert _check("cpu", dtype) == []


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    # GQA with head counts that are not powers of two; multi-head attention (kv = heads); half head dimensions
    # that are not (Phi-3's 96: 48 here as 12 and 6)
    return _check("cpu", torch.float32) + _check("cpu", torch.float32, s=5, b=2, heads=3, kv_heads=3, d=8) \
        + _check("cpu", torch.float32, s=4, b=1, heads=6, kv_heads=1, d=32) \
        + _check("cpu", torch.float32, s=3, b=2, heads=4, kv_heads=2, d=24) \
        + _check("cpu", torch.float32, s=3, b=1, heads=2, kv_heads=1, d=12)


def test_triton_rotary_matches_apply_rotary_interpreted(monkeypatch):
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_rotary_matches_apply_rotary_on_cuda(dtype):
    assert _check("cuda", dtype) == [] and _check("cuda", dtype, s=2048, b=2, heads=16, kv_heads=4, d=128) == []
    assert _check("cuda", dtype, s=1024, b=2, heads=32, kv_heads=32, d=96) == []   # Phi-3: half of 96 is 48


def _llama_step(fused: bool, mode: str, monkeypatch, device: str):
    """One training step of a tiny Llama-style model (GQA) with the fused rotary or PyTorch's, fp32."""
    import runtime.rotary as rot
    from tests.runtime.test_norm import _model_step
    monkeypatch.setattr(rot, "use_triton", rot.use_triton if fused else (lambda dev: False))
    from planner.model import tiny_model
    return _model_step("llama", [mode] * tiny_model("llama").num_layers, True, monkeypatch, device=device)


def _same_training(device, monkeypatch) -> list[str]:
    bad = []
    for mode in ("none", "selective", "full"):
        loss_f, grads_f = _llama_step(True, mode, monkeypatch, device)
        loss_p, grads_p = _llama_step(False, mode, monkeypatch, device)
        if abs(loss_f - loss_p) > 1e-5 * abs(loss_p):
            bad.append(f"{mode}: loss {loss_f} against {loss_p}")
        for name, g in grads_p.items():
            if (grads_f[name] - g).abs().max().item() > 1e-4 * max(1e-6, g.abs().max().item()) + 1e-7:
                bad.append(f"{mode}: {name}")
    return bad


def _attention_layer(fused: bool, monkeypatch, device: str):
    """A tiny Llama attention block (GQA) forward and backward, fused rotary or PyTorch's: output, input gradient,
    qkv weight gradient."""
    import runtime.rotary as rot
    from planner.model import tiny_model
    from runtime.mesh import single_process_groups
    from runtime.model import Attention
    monkeypatch.setattr(rot, "use_triton", rot.use_triton if fused else (lambda dev: False))
    spec = tiny_model("llama")
    torch.manual_seed(0)
    attn = Attention(spec, single_process_groups(), overlap=False).to(device)
    for prm in attn.parameters():
        torch.nn.init.normal_(prm, std=0.05)
    s, b = 12, 3
    x = torch.randn(s, b, spec.hidden, device=device, requires_grad=True)
    cos, sin = rotary_tables(torch.arange(s, device=device), spec)
    out = attn(x, (cos, sin), False)
    out.backward(torch.randn_like(out))
    return out.detach(), x.grad, attn.qkv.weight.grad


def _interpreted_attention(rank, world):
    import pytest as _pytest
    mp = _pytest.MonkeyPatch()
    fused, plain = _attention_layer(True, mp, "cpu"), _attention_layer(False, mp, "cpu")
    return [name for name, a, b in zip(("output", "input gradient", "qkv weight gradient"), fused, plain)
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-6)]


def test_attention_with_fused_rotary_matches_the_plain_one_interpreted(monkeypatch):
    """model.Attention with the fused kernel (its head counts, qkv layout and tables as the model passes them)
    against PyTorch's rotary: output and gradients. Whole models train the same on CUDA (below)."""
    assert run_interpreted(_interpreted_attention, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_llama_trains_the_same_with_fused_and_plain_rotary_on_cuda(monkeypatch):
    assert _same_training("cuda", monkeypatch) == []


# -- the spec's rotary frequencies: rope_theta and Llama 3.1 scaling ------------------------------------------

def test_rotary_inverse_frequencies_by_hand():
    """head_dim 8: pair i turns by theta^(-2i/8) per position, so theta 10000 gives 1, 0.1, 0.01, 0.001 and theta
    16 gives 1, 1/2, 1/4, 1/8."""
    spec = tiny_model("llama", head_dim_override=8)
    torch.testing.assert_close(rotary_inv_freq(spec), torch.tensor([1.0, 0.1, 0.01, 0.001]))
    torch.testing.assert_close(rotary_inv_freq(tiny_model("llama", head_dim_override=8, rope_theta=16.0)),
                               torch.tensor([1.0, 0.5, 0.25, 0.125]))


def test_llama3_scaled_inverse_frequencies_by_hand():
    """theta 10000, head_dim 8: wavelengths 2 pi / f = 2 pi, 20 pi, 200 pi, 2000 pi. Original context 1000, low 1,
    high 4: wavelengths below 1000 / 4 = 250 keep their frequency (2 pi, 62.8), above 1000 / 1 are divided by the
    factor 8 (6283), and 200 pi = 628 between the two is interpolated with a = (1000 / 628.3 - 1) / (4 - 1)."""
    spec = tiny_model("llama", head_dim_override=8, rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                      rope_high_freq_factor=4.0, rope_original_max_positions=1000)
    a = (1000 / (200 * math.pi) - 1) / 3
    assert 0 < a < 1   # 0.197: really between the bounds
    want = torch.tensor([1.0, 0.1, (1 - a) * 0.01 / 8 + a * 0.01, 0.001 / 8])
    torch.testing.assert_close(rotary_inv_freq(spec), want)
    # the interpolation meets the two other rules at the bounds: original 250 puts wavelength 200 pi above 250 / 1
    # (divided), original 2513 = 800 pi rounded puts it just past 2513 / 4 (a = 0.9999: as good as kept)
    at_low = tiny_model("llama", head_dim_override=8, rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                        rope_high_freq_factor=4.0, rope_original_max_positions=250)
    assert rotary_inv_freq(at_low)[2].item() == pytest.approx(0.01 / 8)
    at_high = tiny_model("llama", head_dim_override=8, rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                         rope_high_freq_factor=4.0, rope_original_max_positions=round(800 * math.pi))
    assert rotary_inv_freq(at_high)[2].item() == pytest.approx(0.01, rel=1e-3)


def _layer_tables(spec, positions):
    """The (cos, sin) a whole tiny model's layers receive for `positions`, and its loss."""
    from runtime.mesh import single_process_groups
    from runtime.model import TransformerLayer, build_model
    model = build_model(spec, single_process_groups())
    seen = []
    for m in model.modules():
        if isinstance(m, TransformerLayer):
            m.register_forward_pre_hook(lambda mod, args: seen.append(args[1]))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (2, len(positions)), generator=gen)
    labels = torch.randint(0, spec.vocab_size, (2, len(positions)), generator=gen)
    loss, _ = model(tokens, positions, labels=labels)
    assert len(seen) == spec.num_layers and all(t is seen[0] for t in seen)
    return seen[0], loss.item()


def test_the_model_rotates_at_the_spec_theta():
    """A tiny Llama at rope_theta 500000 gets the tables of the formula at its (here CP-like, not from 0) positions,
    not theta 10000's, and so another loss from the same weights."""
    positions = torch.arange(16, 48)
    spec = tiny_model("llama", rope_theta=500000.0)
    (cos, sin), loss = _layer_tables(spec, positions)
    d = spec.head_dim
    inv = 500000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * torch.cat([inv, inv])[None, :]
    torch.testing.assert_close(cos.double(), angles.cos(), rtol=0, atol=1e-5)
    torch.testing.assert_close(sin.double(), angles.sin(), rtol=0, atol=1e-5)
    (cos_default, _), loss_default = _layer_tables(tiny_model("llama"), positions)
    assert (cos_default - cos).abs().max() > 0.1
    assert loss != loss_default
    # and Llama 3.1 scaling reaches the layers too
    scaled = tiny_model("llama", rope_theta=500000.0, rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                        rope_high_freq_factor=4.0, rope_original_max_positions=16)
    (cos_scaled, _), _ = _layer_tables(scaled, positions)
    want = torch.cat([rotary_inv_freq(scaled)] * 2)
    torch.testing.assert_close(cos_scaled, (positions.float()[:, None] * want).cos())
    assert (cos_scaled - cos).abs().max() > 0.1
