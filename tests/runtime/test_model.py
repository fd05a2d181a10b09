"""Model construction: exact parameter counts, stages, recompute modes give the same numbers."""
import pytest
import torch

from planner.model import CATALOGUE, tiny_model
from runtime.mesh import single_process_groups
from runtime.model import build_model, build_stage
from tests.runtime.equiv import tiny_spec


@pytest.mark.parametrize("name", ["gpt-1.3b", "llama3-8b", "bert-large", "gpt-175b"])
def test_catalogue_parameter_count_matches_spec(name):
    spec = CATALOGUE[name]
    model = build_model(spec, single_process_groups(), device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.total_params()


@pytest.mark.parametrize("family", ["gpt", "llama", "bert", "llama+qkv_bias+attn_out_bias",
                                    "llama+qk_norm+head_dim_override=24", "gemma"])
def test_tiny_counts_and_stage_split(family):
    spec = tiny_spec(family)
    g = single_process_groups()
    full = build_model(spec, g)
    assert sum(p.numel() for p in full.parameters()) == spec.total_params()
    first = build_stage(spec, g, 0, 2, True, False)
    last = build_stage(spec, g, 2, 4, False, True)
    n = sum(p.numel() for p in first.parameters()) + sum(p.numel() for p in last.parameters())
    tied_copy = spec.vocab_size * spec.hidden if spec.tie_embeddings else 0
    assert n == spec.total_params() + tied_copy
    # the same names and values wherever a layer lives
    full_sd = dict(full.named_parameters())
    for name, p in list(first.named_parameters()) + list(last.named_parameters()):
        ref = full_sd[getattr(p, "logical_name", name)]
        assert torch.equal(p, ref), name


@pytest.mark.parametrize("family", ["gpt", "llama", "bert", "llama+qk_norm+head_dim_override=24", "gemma"])
def test_recompute_modes_same_loss_and_grads(family):
    spec = tiny_spec(family)
    g = single_process_groups()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab_size, (2, 32), generator=gen)
    labels = torch.randint(0, spec.vocab_size, (2, 32), generator=gen)
    types = torch.zeros_like(tokens) if family == "bert" else None
    results = []
    for modes in (["none"] * 4, ["selective"] * 4, ["full"] * 4, ["full", "selective", "none", "full"]):
        m = build_model(spec, g, modes)
        loss, n = m(tokens, token_types=types, labels=labels)
        (loss / n).backward()
        results.append((loss.detach(), {k: p.grad.clone() for k, p in m.named_parameters()}))
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        for k in grads:
            torch.testing.assert_close(grads[k], results[0][1][k], rtol=1e-5, atol=1e-7)


def test_selective_recompute_keeps_fewer_tensors():
    """Saved-activation bytes per layer fall from none > selective > full (what the planner counts)."""
    spec = tiny_model("gpt", num_layers=1)
    g = single_process_groups()
    sizes = {}
    for mode in ("none", "selective", "full"):
        m = build_stage(spec, g, 0, 1, False, False, [mode])
        x = torch.randn(32, 2, spec.hidden, requires_grad=True)
        seen = {}

        def pack(t):
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(x)
        sizes[mode] = sum(seen.values())
    assert sizes["none"] > sizes["selective"] > sizes["full"]


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_saved_activations_match_the_documented_list(family):
    """The per-token list at the top of runtime/model.py, in elements (fp32 run; on GPU all but the
    LayerNorm statistics and the log-sum-exp are bf16). Llama adds the shared rotary tables and, on CPU
    only, the RMSNorm composite's normalised input."""
    from runtime.memory import saved_bytes_per_token
    spec = tiny_model(family, hidden=64, ffn_hidden=96, num_layers=1)
    h, f, qkv, q, heads = spec.hidden, spec.ffn_hidden, spec.q_width + 2 * spec.kv_width, spec.q_width, spec.num_heads
    ln_stats = 2 * 2  # mean and rstd of two LayerNorms
    expected = {
        "none": 4 * h + ln_stats + qkv + heads + q + 2 * f,
        "selective": (2 * h + ln_stats + qkv + q + f) if family == "gpt" else (4 * h + ln_stats + qkv + q + f),
        "full": h,
    }
    for mode, n in expected.items():
        assert saved_bytes_per_token(spec, mode) / 4 == n, mode


def test_gpt_style_with_fewer_kv_heads_builds_and_trains():
    """Configs read as GPT-style with grouped or multi-query attention (falcon, starcoder2: planner/model/hf_config.py,
    PLAIN_MLP_TYPES): the runtime builds exactly the parameters the planner counts, and a step gives finite
    gradients on every parameter."""
    for kv in (2, 1):
        spec = tiny_model("gpt", num_kv_heads=kv, tie_embeddings=False)
        model = build_model(spec, single_process_groups())
        assert sum(p.numel() for p in model.parameters()) == spec.total_params()
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, spec.vocab_size, (2, 32), generator=gen)
        loss, n = model(tokens, labels=torch.roll(tokens, -1, dims=1))
        (loss / n).backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("family", ["gpt", "llama", "bert"])
def test_every_norm_uses_the_spec_norm_eps(family):
    """Both norms of every layer, the decoders' final norm, BERT's embedding and MLM-head norms: spec.norm_eps (BERT's
    tiny model and catalogue 1e-12 by default), and the normalisation computed with it."""
    from runtime.model import Norm
    assert tiny_model(family).norm_eps == (1e-12 if family == "bert" else 1e-5)
    spec = tiny_model(family, norm_eps=0.5)
    model = build_model(spec, single_process_groups())
    norms = [m for m in model.modules() if isinstance(m, Norm)]
    assert len(norms) == 2 * spec.num_layers + 1 + (family == "bert") and {n.eps for n in norms} == {0.5}
    x = torch.randn(3, 2, spec.hidden, dtype=torch.float64)
    norm = norms[-1].double()
    with torch.no_grad():
        norm.weight.normal_()
        if family == "llama":
            want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 0.5) * norm.weight
        else:
            norm.bias.normal_()
            xc = x - x.mean(-1, keepdim=True)
            want = xc / torch.sqrt(xc.pow(2).mean(-1, keepdim=True) + 0.5) * norm.weight + norm.bias
        torch.testing.assert_close(norm(x), want)


def test_qk_norm_is_a_per_head_rms_norm_before_rotary():
    """Qwen3's q/k norms (spec.qk_norm): each head of q and of k divided by its root mean square over head_dim (plus
    norm_eps) and scaled by the [head_dim] q_norm / k_norm weight, then rotated; v untouched. The attention core
    against plain PyTorch arithmetic (float64), with weights drawn away from one and q's unlike k's."""
    import torch.nn.functional as F
    from runtime.attention import rotary_tables
    spec = tiny_model("llama", qk_norm=True, head_dim_override=24, norm_eps=1e-3, num_layers=1)
    attn = build_model(spec, single_process_groups()).layers["0"].attn.double()
    assert attn.q_norm.shape == attn.k_norm.shape == (24,)
    assert attn.q_norm.sequence_parallel and attn.k_norm.sequence_parallel and attn.q_norm.tp_dim is None
    s, b, heads, kv, d = 8, 2, spec.num_heads, spec.num_kv_heads, spec.head_dim
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        attn.q_norm.copy_(1 + torch.randn(d, generator=gen, dtype=torch.float64))
        attn.k_norm.copy_(1 + torch.randn(d, generator=gen, dtype=torch.float64))
    qkv = 3 * torch.randn(s, b, (heads + 2 * kv) * d, generator=gen, dtype=torch.float64)

    def rms_norm(x, w):  # x [s, b, n, d]
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + spec.norm_eps) * w

    q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
    q = rms_norm(q.view(s, b, heads, d), attn.q_norm.detach())
    k = rms_norm(k.view(s, b, kv, d), attn.k_norm.detach())
    with torch.no_grad():
        torch.testing.assert_close(attn.qk_normalize(qkv), torch.cat([q.flatten(2), k.flatten(2), v], -1))
        cos, sin = rotary_tables(torch.arange(s), spec)
        cos, sin = cos.double(), sin.double()

        def rotate(x):  # [s, b, n, d] -> [b, n, s, d]
            x = x.permute(1, 2, 0, 3)
            x1, x2 = x.chunk(2, dim=-1)
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin
        qr, kr = rotate(q), rotate(k).repeat_interleave(heads // kv, 1)
        vr = v.reshape(s, b, kv, d).permute(1, 2, 0, 3).repeat_interleave(heads // kv, 1)
        want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True).permute(2, 0, 1, 3).reshape(s, b, heads * d)
        torch.testing.assert_close(attn.core(qkv, cos, sin), want)
