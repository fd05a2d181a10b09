"""Model families through their registry alone (planner/model/families.py): a toy family registered in the test
is counted, planned and trained on CPU by the runtime, with no other file naming it; an unknown family is one
sentence; a combination of traits the runtime does not build is refused."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.cluster import ClusterSpec
from planner.errors import PlanError
from planner.model import FAMILIES, ModelFamily, ModelSpec, family_of, register_family, tiny_model, validate_model
from planner.model.families import validate_family
from planner.plan import Plan, TrainingShape
from planner.search import search

TOY = ModelFamily(
    name="toy", norm="rmsnorm", post_norm=False, mlp="swiglu", linear_bias=False, positions="learned",
    objective="causal_lm", embedding_norm=True, default_tie_embeddings=True, host_figures_of="llama",
    summary="decoder: RMSNorm, SwiGLU, learned positions, a norm after the embedding")
"""A family none of the shipped ones is: Llama's layer with GPT's learned positions and tied output layer, and an
embedding norm without BERT's token types."""

VARIANTS = [
    TOY,
    # GELU without linear biases, LayerNorm, rotary: GPT's MLP in a Llama-style decoder
    ModelFamily(name="toy_gelu_rope", norm="layernorm", post_norm=False, mlp="gelu", linear_bias=False,
                positions="rotary", objective="causal_lm", host_figures_of="gpt"),
    # a post-norm masked-LM encoder with RMSNorm and no token types, head transform or embedding norm
    ModelFamily(name="toy_encoder", norm="rmsnorm", post_norm=True, mlp="gelu", linear_bias=True,
                positions="learned", objective="masked_lm", host_figures_of="bert"),
]


@pytest.fixture
def registered():
    """Registers VARIANTS for one test and removes them after it."""
    for fam in VARIANTS:
        register_family(fam)
    yield
    for fam in VARIANTS:
        FAMILIES.pop(fam.name, None)


def test_unknown_family_is_one_sentence():
    spec = replace(tiny_model("gpt"), family="nope")
    for call in (lambda: validate_model(spec), lambda: family_of("nope"), lambda: spec.model_family,
                 lambda: tiny_model("nope"), lambda: ModelSpec.from_dict(dict(tiny_model("gpt").to_dict(), family="nope"))):
        with pytest.raises(PlanError) as exc:
            call()
        assert str(exc.value) == "model family 'nope' is not one of gpt, llama, bert, gemma"


def test_registry_refuses_what_is_not_built():
    with pytest.raises(PlanError, match=r"biases on a gated \(SwiGLU / GeGLU\) MLP are not modelled"):
        validate_family(replace(TOY, linear_bias=True))
    with pytest.raises(PlanError, match=r"norm_unit_offset \(\(1 \+ weight\) scaling\) is modelled for RMSNorm only"):
        validate_family(replace(TOY, norm="layernorm", norm_unit_offset=True))
    with pytest.raises(PlanError, match="mlp 'reglu' is not one of gelu, swiglu, geglu"):
        validate_family(replace(TOY, mlp="reglu"))
    with pytest.raises(PlanError, match="norm 'batchnorm' is not one of layernorm, rmsnorm"):
        validate_family(replace(TOY, norm="batchnorm"))
    with pytest.raises(PlanError, match="host_figures_of 'toy2' is not a family the host probe measures"):
        validate_family(replace(TOY, host_figures_of="toy2"))
    with pytest.raises(PlanError, match="'gpt' is already registered with other traits"):
        register_family(replace(FAMILIES["gpt"], post_norm=True))
    register_family(FAMILIES["gpt"])  # the same entry again: a no-op
    assert list(FAMILIES)[:4] == ["gpt", "llama", "bert", "gemma"]


def test_shipped_families_keep_their_traits():
    """The traits the planner and runtime read of the shipped families (what their former name tests decided)."""
    gpt, llama, bert = (family_of(n) for n in ("gpt", "llama", "bert"))
    assert (gpt.layernorm, gpt.gated_mlp, gpt.linear_bias, gpt.learned_positions, gpt.causal) == (True, False, True, True, True)
    assert (llama.layernorm, llama.gated_mlp, llama.linear_bias, llama.learned_positions, llama.causal) == \
        (False, True, False, False, True)
    assert (bert.post_norm, bert.causal, bert.masked_lm, bert.token_types, bert.embedding_norm, bert.head_transform) == \
        (True, False, True, True, True, True)
    assert not gpt.post_norm and not llama.post_norm and not gpt.head_transform and not llama.token_types
    assert [f.allows_qk_norm for f in (gpt, llama, bert)] == [False, True, False]
    assert not any(f.norm_unit_offset or f.embedding_scale for f in (gpt, llama, bert))
    assert [f.uses_gelu for f in (gpt, llama, bert)] == [True, False, True]


def test_gemma_is_llamas_layer_with_its_own_parts():
    """Gemma: Llama's shapes (RMSNorm, a gated MLP of three matrices, rotary, no biases) with GeGLU, (1 + weight)
    norms, a scaled embedding and a tied output layer; the same parameter and FLOP counts as a Llama of its shape;
    priced with Llama's host figures. GeGLU experts and a GELU form on a family without GELU are refused."""
    gemma = family_of("gemma")
    assert (gemma.norm, gemma.gated_mlp, gemma.mlp, gemma.learned_positions, gemma.linear_bias, gemma.causal) == \
        ("rmsnorm", True, "geglu", False, False, True)
    assert gemma.norm_unit_offset and gemma.embedding_scale and gemma.uses_gelu and not gemma.allows_qk_norm
    assert gemma.host_key == "llama" and gemma.default_tie_embeddings
    g = tiny_model("gemma")
    as_llama = replace(g, family="llama")
    assert (g.total_params(), g.layer_matmul_flops_per_token()) == \
        (as_llama.total_params(), as_llama.layer_matmul_flops_per_token())
    with pytest.raises(PlanError, match="GeGLU experts are not modelled"):
        validate_model(replace(g, num_experts=4, top_k=2))
    with pytest.raises(PlanError, match="gelu_approximate 'none' is set but family 'llama' runs no GELU"):
        validate_model(replace(tiny_model("llama"), gelu_approximate="none"))
    with pytest.raises(PlanError, match="gelu_approximate must be one of tanh, none"):
        validate_model(replace(g, gelu_approximate="erf"))
    assert replace(tiny_model("bert"), gelu_approximate="none").fused_bias_gelu is False
    assert tiny_model("bert").fused_bias_gelu and tiny_model("gpt").fused_bias_gelu and not g.fused_bias_gelu


def test_gemma_counts_match_the_runtime():
    """The runtime's Gemma allocates what the planner counts (no parameter for the embedding scale)."""
    from runtime.mesh import single_process_groups
    from runtime.model import build_model

    spec = tiny_model("gemma")
    model = build_model(spec, single_process_groups(), device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.total_params()


@pytest.mark.parametrize("name", [f.name for f in VARIANTS])
def test_toy_family_counts_match_the_runtime(registered, name):
    """The planner's parameter counts of a registered family are the tensors the runtime allocates, whole and
    split into two pipeline stages."""
    from runtime.mesh import single_process_groups
    from runtime.model import build_model, build_stage

    spec = tiny_model(name)
    g = single_process_groups()
    model = build_model(spec, g, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.total_params()
    first, last = build_stage(spec, g, 0, 2, True, False, device="meta"), build_stage(spec, g, 2, 4, False, True,
                                                                                       device="meta")
    tied_copy = spec.padded_vocab * spec.hidden if spec.tie_embeddings else 0
    assert sum(p.numel() for s in (first, last) for p in s.parameters()) == spec.total_params() + tied_copy


def _plan_and_train(spec):
    """The planner searches spec on one CPU 'GPU', its plan file reloads, and the runtime trains the plan in this
    process (single rank) 6 steps on a repeated batch: (the stages, the first micro-batch, the losses)."""
    import torch

    from planner.profile import load_profile
    from runtime.data import open_source, step_micro_batches
    from runtime.mesh import single_process_groups
    from runtime.parallel.data_parallel import AdamConfig, build_optimizer
    from runtime.step import select_train_step
    from runtime.train import build_rank_stages

    shape = TrainingShape(seq_len=32, global_batch=4)
    cluster = ClusterSpec(gpu="cpu", num_gpus=1, gpus_per_node=1)
    res = search(spec, shape, cluster, load_profile("h200-sxm", "h200-sxm"), top_k=1)
    assert res.plans
    plan = res.plans[0]
    assert plan.prediction.step_s > 0 and math.isfinite(plan.prediction.step_s)
    assert Plan.from_dict(plan.to_dict()).model == spec

    lay = plan.layout
    groups = single_process_groups(lay)
    torch.manual_seed(0)
    stages = build_rank_stages(plan, groups, torch.device("cpu"), lay.overlap_tp, 1234)
    assert sum(p.numel() for s in stages for p in s.parameters()) == spec.total_params()
    opt = build_optimizer(stages, groups, lay.sharding, AdamConfig(lr=3e-3), torch.float32, lay.overlap_dp)
    step = select_train_step(lay)
    source = open_source("synthetic", spec.vocab_size, shape.seq_len, None, seed=1)
    mbs = step_micro_batches(source, spec.family, spec.vocab_size, shape.seq_len, shape.global_batch,
                             lay.micro_batch, lay.dp, 0, 0)
    try:
        losses = [float(step(stages, mbs, opt, groups, 3e-3)[0]) for _ in range(6)]
    finally:
        opt.close()
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.5, losses
    return stages, mbs[0], losses


def test_toy_family_plans_and_trains_on_cpu(registered):
    """A toy family registered here alone: the planner searches it on one CPU 'GPU', its plan file reloads, and the
    runtime trains the plan in this process (single rank): the loss is finite and falls on a repeated batch."""
    spec = tiny_model("toy")
    assert spec.model_family is TOY
    stages, mb, _ = _plan_and_train(spec)
    assert stages[0].embedding.norm is not None and stages[0].embedding.token_type is None
    assert "token_types" not in mb and mb["labels"].shape[1] == 32


def test_gemma_plans_and_trains_on_cpu():
    """Gemma's parts (GeGLU, (1 + weight) norms starting at zero, the scaled embedding) plan and train: the loss is
    finite and falls on a repeated batch."""
    stages, _, _ = _plan_and_train(tiny_model("gemma"))
    norm = stages[0].layers["0"].attn_norm
    assert norm.unit_offset and stages[0].embedding.scale == 8.0  # sqrt(64)


def test_a_spec_written_before_the_gelu_form_and_model_type_loads_as_it_trained():
    """A plan's model from before gelu_approximate and hf_model_type: the tanh GELU the runtime computed then, no
    recorded type; a bad value of either is one sentence."""
    d = tiny_model("bert").to_dict()
    for k in ("gelu_approximate", "hf_model_type"):
        del d[k]
    m = ModelSpec.from_dict(d)
    assert (m.gelu_approximate, m.hf_model_type) == ("tanh", "")
    with pytest.raises(PlanError, match="hf_model_type must be a string, got 3"):
        ModelSpec.from_dict(dict(d, hf_model_type=3))
