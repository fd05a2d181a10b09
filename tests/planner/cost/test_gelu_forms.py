"""The cost and memory models of Gemma's GeGLU and of BERT's exact (erf) GELU: Gemma is priced and held as a Llama of
its shape (GeGLU's one kernel each way moves SwiGLU's bytes: runtime/geglu.py), and the erf GELU, which adds fc1's
bias in the GEMM (no fused bias-GELU kernel), pays fc1's bias-gradient sum by hand-computed bytes."""
import copy
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.memory.activations import layer_activations
from planner.model import tiny_model
from planner.plan import Layout, TrainingShape
from planner.profile import load_profile

SHAPE = TrainingShape(2048, 8)


def _layer(spec, lay, prof):
    cl = ClusterSpec(gpu="h200-sxm", num_gpus=lay.world_size, gpus_per_node=lay.world_size)
    return CostModel(spec, SHAPE, lay, cl, prof).layer


def _with_bias_rate(prof, rate):
    extras = copy.deepcopy(prof.extras)
    k = extras["elementwise"].get("kernels", extras["elementwise"])
    k["bias_grad"] = {"seconds": 1.0 / rate, "bytes": 1.0}
    return replace(prof, extras=extras)


@pytest.mark.parametrize("tp", [1, 2])
def test_gemma_costs_and_holds_what_a_llama_of_its_shape_does(tp):
    gemma = replace(tiny_model("gemma"), hidden=2048, num_heads=16, num_kv_heads=16, ffn_hidden=8192,
                    head_dim_override=256)
    llama = replace(gemma, family="llama", gelu_approximate="tanh")
    lay = Layout(tp=tp, micro_batch=1, sharding="none")
    prof = load_profile("h200-sxm", "h200-sxm")
    a, b = _layer(gemma, lay, prof), _layer(llama, lay, prof)
    assert (a.fwd_compute_s, a.bwd_compute_s) == (b.fwd_compute_s, b.bwd_compute_s)
    assert layer_activations(gemma, SHAPE, lay) == layer_activations(llama, SHAPE, lay)


@pytest.mark.parametrize("tp", [1, 2])
def test_bert_erf_gelu_pays_fc1s_bias_sum_by_hand(tp):
    tanh = replace(tiny_model("bert"), hidden=1024, num_heads=16, num_kv_heads=16, ffn_hidden=4096)
    erf = replace(tanh, gelu_approximate="none")
    lay = Layout(tp=tp, micro_batch=2, sharding="none")
    base = load_profile("h200-sxm", "h200-sxm")
    slow, fast = _with_bias_rate(base, 1e12), _with_bias_rate(base, 2e12)
    extra = (_layer(erf, lay, slow).bwd_compute_s - _layer(erf, lay, fast).bwd_compute_s) \
        - (_layer(tanh, lay, slow).bwd_compute_s - _layer(tanh, lay, fast).bwd_compute_s)
    T = 2 * SHAPE.seq_len
    nbytes = 2 * T * (tanh.ffn_hidden // tp)  # bf16 dY of fc1, this rank's columns over all tokens
    assert extra == pytest.approx(base.eff("compute") * (nbytes / 1e12 - nbytes / 2e12))
