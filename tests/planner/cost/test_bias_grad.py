"""The layer's backward pays one bias-gradient reduction per linear layer with a bias (GPT, BERT; Llama-style
models only their attention biases, where they have them): dY summed over its rows, priced from the profile's
measured `bias_grad` kernel (hand-computed bytes); except fc1's, whose gradient comes with the activation's
backward (runtime/bias_gelu.py)."""
import copy
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.model import resolve_model
from planner.plan import Layout, TrainingShape
from planner.profile import load_profile


def _with_bias_rate(prof, rate):
    extras = copy.deepcopy(prof.extras)
    k = extras["elementwise"].get("kernels", extras["elementwise"])
    k["bias_grad"] = {"seconds": 1.0 / rate, "bytes": 1.0}
    return replace(prof, extras=extras)


def _bwd(spec, lay, prof):
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
    return CostModel(spec, TrainingShape(2048, 8), lay, cl, prof).layer.bwd_compute_s


@pytest.mark.parametrize("tp", [1, 2])
def test_gpt_backward_pays_three_bias_sums_by_hand(tp):
    spec, lay = resolve_model("gpt-1.3b"), Layout(tp=tp, micro_batch=2, sharding="none")
    base = load_profile("h200-sxm", "h200-sxm")
    slow, fast = _with_bias_rate(base, 1e12), _with_bias_rate(base, 2e12)
    T, h = 2 * 2048, spec.hidden
    qkv = (spec.q_width + 2 * spec.kv_width) // tp
    nbytes = 2 * (T * qkv + T / tp * h + T / tp * h)   # bf16 dY of qkv, proj, fc2 (fc1's: in bias_gelu_bwd)
    ce = base.eff("compute")
    assert _bwd(spec, lay, slow) - _bwd(spec, lay, fast) == pytest.approx(ce * (nbytes / 1e12 - nbytes / 2e12))


def test_llama_has_no_bias_sums():
    spec, lay = resolve_model("llama3-8b"), Layout(micro_batch=1, sharding="none")
    base = load_profile("h200-sxm", "h200-sxm")
    assert _bwd(spec, lay, _with_bias_rate(base, 1e12)) == _bwd(spec, lay, _with_bias_rate(base, 2e12))


@pytest.mark.parametrize("out_bias", [False, True])
def test_llama_attention_biases_pay_their_sums_by_hand(out_bias):
    """Qwen2-style q/k/v biases: the qkv sum over all T tokens of this rank's columns; Llama's attention_bias adds
    the output projection's over this rank's sequence shard. The SwiGLU MLP has none."""
    tp = 2
    spec = replace(resolve_model("llama3-8b"), qkv_bias=True, attn_out_bias=out_bias)
    lay = Layout(tp=tp, micro_batch=2, sharding="none")
    base = load_profile("h200-sxm", "h200-sxm")
    slow, fast = _with_bias_rate(base, 1e12), _with_bias_rate(base, 2e12)
    T = 2 * 2048
    nbytes = 2 * (T * (spec.q_width + 2 * spec.kv_width) // tp + (T / tp * spec.hidden if out_bias else 0))
    ce = base.eff("compute")
    assert _bwd(spec, lay, slow) - _bwd(spec, lay, fast) == pytest.approx(ce * (nbytes / 1e12 - nbytes / 2e12))


def test_gpt_fc1_bias_is_priced_inside_the_activation():
    """bias_gelu_bwd where the profile measured it, else plain GELU's backward rate (older profiles)."""
    spec, lay = resolve_model("gpt-1.3b"), Layout(micro_batch=2, sharding="none")
    base = load_profile("h200-sxm", "h200-sxm")

    def with_kernel(name, rate):
        extras = copy.deepcopy(base.extras)
        extras["elementwise"].get("kernels", extras["elementwise"])[name] = {"seconds": 1.0 / rate, "bytes": 1.0}
        return replace(base, extras=extras)
    nbytes = 2 * 3 * 2 * 2048 * spec.ffn_hidden   # bf16 y, g read and dy written over [tokens, ffn]
    ce = base.eff("compute")
    for name in ("bias_gelu_bwd", "gelu_bwd"):
        slow, fast = with_kernel(name, 1e12), with_kernel(name, 2e12)
        if name == "gelu_bwd":  # a profile measured before bias_gelu existed: plain GELU's rate stands in
            for p in (slow, fast):
                p.extras["elementwise"].get("kernels", p.extras["elementwise"]).pop("bias_gelu_bwd", None)
        assert _bwd(spec, lay, slow) - _bwd(spec, lay, fast) == pytest.approx(ce * (nbytes / 1e12 - nbytes / 2e12))
