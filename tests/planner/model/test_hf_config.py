"""Hugging Face config.json import (planner/model/hf_config.py): each family's keys, their checks, and the refusals
of what the planner does not model, each in one sentence."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from planner.errors import PlanError
from planner.model import CATALOGUE, ModelSpec, from_hf_config, resolve_model, tiny_model
from tests.planner.conftest import run_cli


# -- Hugging Face config.json import --------------------------------------------------------------------

def _write(tmp_path, cfg, name="config.json"):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return p


LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
              "max_position_embeddings": 32768, "tie_word_embeddings": False}
QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
             "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
             "max_position_embeddings": 32768, "tie_word_embeddings": True}
GPT2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "n_ctx": 1024,
        "vocab_size": 50257}
BERT_BASE = {"model_type": "bert", "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
             "num_hidden_layers": 12, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}


def test_import_llama_matches_catalogue(tmp_path):
    m = from_hf_config(_write(tmp_path, LLAMA3_8B))
    assert m.family == "llama" and m.num_kv_heads == 8 and not m.tie_embeddings
    assert m.total_params() == CATALOGUE["llama3-8b"].total_params() == 8_030_261_248
    assert m.name == "model"  # the folder's name


def test_import_mistral(tmp_path):
    m = resolve_model(str(_write(tmp_path, MISTRAL_7B).parent))  # a folder holding config.json
    assert m.total_params() == 7_241_732_096  # Mistral-7B-v0.1


def test_import_mixtral(tmp_path):
    m = from_hf_config(_write(tmp_path, MIXTRAL))
    assert (m.num_experts, m.top_k) == (8, 2)
    assert m.total_params() == CATALOGUE["mixtral-8x7b"].total_params()
    assert m.active_params() == CATALOGUE["mixtral-8x7b"].active_params()


def test_import_qwen2_dense(tmp_path):
    m = from_hf_config(_write(tmp_path, QWEN2_05B))
    assert m.tie_embeddings and m.num_kv_heads == 2 and m.head_dim == 64
    assert (m.qkv_bias, m.attn_out_bias) == (True, False)
    # Qwen2-0.5B has 494,032,768 parameters (Qwen2ForCausalLM, tied), its q/k/v biases among them
    assert m.total_params() == 494_032_768
    # an explicit key is honoured: without the biases, 24 layers x (896 + 2 x 128) fewer
    for key in ("attention_bias", "qkv_bias"):
        off = from_hf_config(_write(tmp_path, dict(QWEN2_05B, **{key: False}), f"{key}.json"))
        assert not off.qkv_bias and off.total_params() == 494_032_768 - 24 * (896 + 2 * 128)


def test_import_attention_bias(tmp_path):
    """Llama-family attention_bias true: biases on q, k, v and the output projection; Qwen2-MoE: q, k, v only."""
    m = from_hf_config(_write(tmp_path, dict(LLAMA3_8B, attention_bias=True)))
    assert (m.qkv_bias, m.attn_out_bias) == (True, True)
    assert m.total_params() == CATALOGUE["llama3-8b"].total_params() + 32 * (4096 + 2 * 1024 + 4096)
    assert not from_hf_config(_write(tmp_path, dict(LLAMA3_8B, attention_bias=False), "f.json")).qkv_bias
    assert not from_hf_config(_write(tmp_path, MISTRAL_7B, "mistral.json")).qkv_bias
    moe = from_hf_config(_write(tmp_path, QWEN15_MOE_A27B, "moe.json"))
    assert (moe.qkv_bias, moe.attn_out_bias) == (True, False)
    assert not from_hf_config(_write(tmp_path, GPT2, "gpt2.json")).qkv_bias  # GPT: biases everywhere (has_bias)


@pytest.mark.parametrize("field", ["qkv_bias", "attn_out_bias", "qk_norm"])
def test_bias_fields_must_be_booleans(field):
    with pytest.raises(PlanError, match=field):
        ModelSpec.from_dict(dict(tiny_model("llama").to_dict(), **{field: 1}))


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_qk_norm_is_refused_outside_llama_style_models(family):
    with pytest.raises(PlanError, match=f"qk_norm .* Llama-style models only, not for family '{family}'"):
        ModelSpec.from_dict(dict(tiny_model(family).to_dict(), qk_norm=True))


# Qwen3-0.6B's and Qwen3-30B-A3B's config.json (Hugging Face Qwen/Qwen3-0.6B, Qwen/Qwen3-30B-A3B), the keys read
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
             "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
             "max_position_embeddings": 40960, "max_window_layers": 28, "num_attention_heads": 16,
             "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
             "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False,
             "vocab_size": 151936}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
                 "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
                 "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
                 "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
                 "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                 "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
                 "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
                 "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936}


def test_import_qwen3_dense(tmp_path):
    """Qwen3-0.6B: q/k norms, head_dim 128 (16 heads x 128 = 2048, not the hidden 1024), tied embeddings, no biases.
    By hand per layer: q 1024 x 2048, k and v 1024 x 1024 each, out 2048 x 1024, q/k norms 2 x 128, SwiGLU 3 x 1024 x
    3072, two norms 2 x 1024: 15,730,944; 28 of them, the tied embedding 151936 x 1024 and the final norm: 596,049,920
    (the model card's 0.6B, 0.44B without the embedding)."""
    m = from_hf_config(_write(tmp_path, QWEN3_06B))
    assert m.qk_norm and (m.qkv_bias, m.attn_out_bias) == (False, False) and m.tie_embeddings
    assert (m.head_dim, m.head_dim_override, m.q_width, m.kv_width) == (128, 128, 2048, 1024)
    assert (m.rope_theta, m.norm_eps, m.num_kv_heads, m.ffn_hidden, m.num_experts) == (1e6, 1e-6, 8, 3072, 1)
    layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    assert m.layer_params() == layer == 15_730_944
    assert m.total_params() == 28 * layer + 151936 * 1024 + 1024 == 596_049_920
    assert m.total_params() - m.embedding_params() == pytest.approx(0.44e9, rel=0.01)
    # Qwen2 and Llama types have no q/k norms; Qwen3 has no q/k/v biases (it is no qwen2 type)
    assert not from_hf_config(_write(tmp_path, QWEN2_05B, "qwen2.json")).qk_norm
    assert not from_hf_config(_write(tmp_path, LLAMA3_8B, "llama.json")).qk_norm
    # OLMo 2's q/k norms span the whole projection and its norms sit after the blocks: refused, not read as Qwen3
    with pytest.raises(PlanError, match="olmo2"):
        from_hf_config(_write(tmp_path, dict(QWEN3_06B, model_type="olmo2"), "olmo2.json"))
    with pytest.raises(PlanError, match="residual_multiplier"):
        from_hf_config(_write(tmp_path, dict(LLAMA3_8B, model_type="granite", residual_multiplier=0.22), "granite.json"))


def test_import_qwen3_moe(tmp_path):
    """Qwen3-30B-A3B: 128 experts of width 768, top 8 renormalised (norm_topk_prob), aux loss 0.001, q/k norms,
    head_dim 128 (32 x 128 = 4096 against the hidden 2048), untied. By hand per layer: q 2048 x 4096, k and v
    2048 x 512 each, out 4096 x 2048, q/k norms 2 x 128, 128 experts of 3 x 2048 x 768, router 128 x 2048, two
    norms: 623,120,640; 48 of them, two 151936 x 2048 embeddings and the final norm: 30,532,122,624 (30.5B), of which
    a token touches 3.35B (3.3B activated)."""
    m = from_hf_config(_write(tmp_path, QWEN3_30B_A3B))
    assert m.qk_norm and not m.qkv_bias and not m.tie_embeddings
    assert (m.num_experts, m.top_k, m.ffn_hidden, m.shared_expert_ffn) == (128, 8, 768, 0)
    assert m.moe_normalize_topk and m.moe_aux_loss_coeff == 0.001 and m.moe_capacity_factor == 0.0
    assert (m.head_dim, m.q_width, m.kv_width, m.norm_eps, m.rope_theta) == (128, 4096, 512, 1e-6, 1e6)
    h, expert = 2048, 3 * 2048 * 768
    layer = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128 + 128 * expert + 128 * h + 2 * h
    assert m.layer_params() == layer == 623_120_640
    assert m.total_params() == 48 * layer + 2 * 151936 * h + h == 30_532_122_624
    assert m.active_params() == 48 * (layer - 120 * expert) + 2 * 151936 * h + h == 3_353_032_704
    # Hugging Face's Qwen3MoeConfig leaves norm_topk_prob false when the key is absent
    bare = dict(QWEN3_30B_A3B)
    del bare["norm_topk_prob"]
    assert not from_hf_config(_write(tmp_path, bare, "bare.json")).moe_normalize_topk


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe"])
@pytest.mark.parametrize("extra,needle", [({"decoder_sparse_step": 2}, "decoder_sparse_step 2"),
                                          ({"mlp_only_layers": [0, 47]}, "mlp_only_layers [0, 47]")])
def test_import_qwen_moe_with_dense_layers_is_refused(tmp_path, model_type, extra, needle):
    """Dense MLP layers among the MoE ones (decoder_sparse_step > 1: only every step-th layer is MoE; mlp_only_layers)
    have other weights, memory and time, which one spec layer cannot express: refused in one sentence, as DeepSeek's
    dense leading layers are. Step 1 and an empty list (the released configs) are read."""
    cfg = dict(QWEN3_30B_A3B, model_type=model_type, **extra)
    with pytest.raises(PlanError, match="keeps dense MLP layers among its MoE layers") as err:
        from_hf_config(_write(tmp_path, cfg))
    assert needle in str(err.value) and str(err.value).count(". ") == 0
    from_hf_config(_write(tmp_path, dict(cfg, decoder_sparse_step=1, mlp_only_layers=[]), "ok.json"))


def test_import_qwen2_moe_keys(tmp_path):
    cfg = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
           "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936,
           "max_position_embeddings": 8192, "num_experts": 60, "num_experts_per_tok": 4}
    m = from_hf_config(_write(tmp_path, cfg))
    assert (m.num_experts, m.top_k, m.ffn_hidden) == (60, 4, 1408)  # expert width, not the dense width
    assert not m.moe_normalize_topk  # Qwen MoE's norm_topk_prob defaults to false
    m = from_hf_config(_write(tmp_path, dict(cfg, norm_topk_prob=True, router_aux_loss_coef=0.001)))
    assert m.moe_normalize_topk and m.moe_aux_loss_coeff == 0.001


def test_import_mixtral_routing_options(tmp_path):
    m = from_hf_config(_write(tmp_path, dict(MIXTRAL, router_aux_loss_coef=0.02)))
    assert m.moe_normalize_topk and m.moe_aux_loss_coeff == 0.02 and m.moe_capacity_factor == 0.0


@pytest.mark.parametrize("field,value", [("moe_aux_loss_coeff", -1.0), ("moe_capacity_factor", float("nan")),
                                         ("moe_normalize_topk", "yes")])
def test_bad_routing_options_are_refused(field, value):
    d = dict(CATALOGUE["mixtral-8x7b"].to_dict(), **{field: value})
    with pytest.raises(PlanError, match=field):
        ModelSpec.from_dict(d)


def test_routing_options_reach_the_runtime_and_the_export():
    """The spec's routing options are what the runtime's MoE layer uses, and what the Megatron export says."""
    import dataclasses
    from planner.export import megatron_args
    from planner.plan import Layout, Plan, StagePlan, TrainingShape
    from runtime.model import build_model
    from runtime.mesh import single_process_groups
    from runtime.parallel.expert import MoEMLP
    spec = dataclasses.replace(tiny_model("llama", num_experts=4, top_k=2), moe_aux_loss_coeff=0.02,
                               moe_normalize_topk=False, moe_capacity_factor=1.25)
    moe = next(m for m in build_model(spec, single_process_groups()).modules() if isinstance(m, MoEMLP))
    assert (moe.aux_coeff, moe.normalize_topk, moe.capacity_factor) == (0.02, False, 1.25)
    plan = Plan(model=spec, cluster={"gpu": "h200-sxm", "num_gpus": 1, "gpus_per_node": 1},
                training=TrainingShape(spec.default_seq_len, 2), layout=Layout(micro_batch=1),
                stages=[StagePlan(spec.num_layers)])
    args = " ".join(megatron_args(plan).args)
    assert "--moe-aux-loss-coeff 0.02" in args and "--moe-expert-capacity-factor 1.25" in args
    assert "--moe-router-pre-softmax" in args


QWEN15_MOE_A27B = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                   "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "num_hidden_layers": 24, "vocab_size": 151936, "max_position_embeddings": 8192, "num_experts": 60,
                   "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632, "tie_word_embeddings": False}


def test_import_qwen_moe_with_shared_experts(tmp_path):
    """Qwen1.5-MoE-A2.7B: 14.3B parameters, 2.7B activated (its model card). By hand: per layer attention
    4 h^2 and the q/k/v biases 3 h, 60 experts of 3 h f, shared 3 h 5632 and its [h] gate, router 60 h, two norms;
    embeddings untied."""
    m = from_hf_config(_write(tmp_path, QWEN15_MOE_A27B))
    assert (m.shared_expert_ffn, m.shared_expert_gate) == (5632, True)
    h = 2048
    layer = 4 * h * h + 3 * h + 60 * 3 * h * 1408 + 3 * h * 5632 + h + 60 * h + 2 * h
    assert m.total_params() == 24 * layer + 2 * 151936 * h + h
    active = m.active_params()
    assert m.total_params() == pytest.approx(14.3e9, rel=0.01) and active == pytest.approx(2.7e9, rel=0.02)
    assert active == 24 * (layer - 56 * 3 * h * 1408) + 2 * 151936 * h + h


def test_import_deepseek_style_shared_experts_and_refusals(tmp_path):
    cfg = dict(QWEN15_MOE_A27B, model_type="deepseek", n_shared_experts=2)
    del cfg["shared_expert_intermediate_size"]
    m = from_hf_config(_write(tmp_path, cfg))
    assert (m.shared_expert_ffn, m.shared_expert_gate) == (2 * 1408, False)  # ungated, 2 x the expert width
    for extra in ({"kv_lora_rank": 512}, {"first_k_dense_replace": 1}):
        with pytest.raises(PlanError, match="DeepSeek"):
            from_hf_config(_write(tmp_path, dict(cfg, **extra)))


def test_import_head_dim_override(tmp_path):
    cfg = dict(LLAMA3_8B, head_dim=256, num_attention_heads=8, num_key_value_heads=4)  # Gemma-style
    m = from_hf_config(_write(tmp_path, cfg))
    assert m.head_dim == 256 and m.q_width == 2048


def test_import_gpt2(tmp_path):
    m = from_hf_config(_write(tmp_path, GPT2))
    assert (m.family, m.num_layers, m.hidden, m.num_heads, m.max_seq_len) == ("gpt", 12, 768, 12, 1024)
    assert m.total_params() - m.vocab_padding_params() == 124_439_808  # GPT-2 small (GPT2Model, tied output)
    assert m.padded_vocab == 50304 and m.vocab_padding_params() == 47 * 768


def test_import_bert(tmp_path):
    m = from_hf_config(_write(tmp_path, BERT_BASE))
    assert m.family == "bert" and not m.causal
    assert m.total_params() == CATALOGUE["bert-base"].total_params()


@pytest.mark.parametrize("cfg,needle", [
    ({k: v for k, v in GPT2.items() if k != "n_layer"}, "lacks the key 'n_layer'"),
    ({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}, "lacks the key 'hidden_size'"),
    ({k: v for k, v in BERT_BASE.items() if k != "vocab_size"}, "lacks the key 'vocab_size'"),
    (dict(LLAMA3_8B, num_hidden_layers="many"), "num_hidden_layers must be a whole number, got 'many'"),
    (dict(LLAMA3_8B, num_attention_heads=0), "num_attention_heads 0 is outside 1..16384"),
    (dict(LLAMA3_8B, num_hidden_layers=0), "num_hidden_layers 0 is outside 1..4096"),
    (dict(LLAMA3_8B, num_hidden_layers=1e12), "num_hidden_layers 1000000000000.0 is outside 1..4096"),
    (dict(LLAMA3_8B, num_hidden_layers=12.5), "num_hidden_layers must be a whole number, got 12.5"),
    (dict(LLAMA3_8B, rope_theta=float("nan")), "rope_theta must be a finite number"),
    (dict(LLAMA3_8B, num_key_value_heads=5), "not divisible by 5 KV heads"),
    ("{not json", "is not readable JSON"),
    ("[1, 2]", "is not a JSON object"),
])
def test_import_errors_are_one_sentence(tmp_path, cfg, needle):
    p = _write(tmp_path, cfg)
    with pytest.raises(PlanError) as e:
        from_hf_config(p)
    msg = str(e.value)
    assert needle in msg and (str(p) in msg or "model 'model'" in msg) and "\n" not in msg


def test_unknown_model_and_missing_file(tmp_path):
    with pytest.raises(PlanError, match="unknown model 'gpt-7'; known models: gpt-1.3b"):
        resolve_model("gpt-7")
    with pytest.raises(PlanError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.json"))


PHI2 = {"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 32,
        "num_hidden_layers": 32, "vocab_size": 51200, "max_position_embeddings": 2048, "partial_rotary_factor": 0.4,
        "hidden_act": "gelu_new", "tie_word_embeddings": False}


def test_import_plain_mlp_types_as_gpt_with_a_warning(tmp_path):
    """phi-2 (a plain GELU MLP, two matrices) is read as GPT-style: within 0.5% of its released 2,779,683,840
    parameters (ours adds GPT's learned positions, 5.2M, and a second norm per layer; it leaves out the head's bias).
    Read as Llama-style, its MLP counted a third matrix: 3.6B. Falcon's multi_query gives one KV head."""
    with pytest.warns(UserWarning, match="model_type 'phi' has a plain GELU MLP and is read as a GPT-style model"):
        m = from_hf_config(_write(tmp_path, PHI2))
    assert (m.family, m.num_layers, m.hidden, m.ffn_hidden, m.tie_embeddings) == ("gpt", 32, 2560, 10240, False)
    assert abs(m.total_params() / 2_779_683_840 - 1) < 0.005
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
              "vocab_size": 65024, "multi_query": True}
    with pytest.warns(UserWarning, match="'falcon'"):
        f = from_hf_config(_write(tmp_path, falcon, "falcon.json"))
    assert (f.num_kv_heads, f.ffn_hidden, f.tie_embeddings) == (1, 4 * 4544, True)


def test_unknown_model_type_is_refused_by_name(tmp_path, recwarn):
    """Only the model types the runtime builds are read: another is named and refused, never planned as Llama."""
    with pytest.raises(PlanError, match="model_type 'newarch' is not one parallel-plan builds; it reads bert, gpt2"):
        from_hf_config(_write(tmp_path, dict(MISTRAL_7B, model_type="newarch")))
    from_hf_config(_write(tmp_path, QWEN2_05B, "qwen.json"))
    from_hf_config(_write(tmp_path, MISTRAL_7B, "mistral.json"))
    assert not [w for w in recwarn if "parallel-plan" in str(w.message) or "model_type" in str(w.message)]


# -- rotary base, norm epsilon, Llama 3.1 rope scaling ------------------------------------------------------

def test_catalogue_rotary_bases_and_norm_epsilons():
    """As the released config.json files say: Llama 3 rope_theta 500000 (405B is Llama 3.1: llama3 rope scaling,
    factor 8, low 1, high 4, original 8192), Mixtral 1e6, rms_norm_eps 1e-5; GPT learned positions and LayerNorm
    1e-5; BERT layer_norm_eps 1e-12."""
    for name in ("llama3-8b", "llama3-70b", "llama3-405b"):
        assert (CATALOGUE[name].rope_theta, CATALOGUE[name].norm_eps) == (500000.0, 1e-5)
    m = CATALOGUE["llama3-405b"]
    assert (m.rope_scaling_factor, m.rope_low_freq_factor, m.rope_high_freq_factor,
            m.rope_original_max_positions) == (8.0, 1.0, 4.0, 8192)
    assert CATALOGUE["llama3-8b"].rope_scaling_factor == CATALOGUE["llama3-70b"].rope_scaling_factor == 0
    for name in ("mixtral-8x7b", "mixtral-8x22b"):
        assert (CATALOGUE[name].rope_theta, CATALOGUE[name].norm_eps) == (1e6, 1e-5)
    for name in ("gpt-1.3b", "gpt-6.7b", "gpt-13b", "gpt-70b", "gpt-175b"):
        assert CATALOGUE[name].learned_positions and CATALOGUE[name].norm_eps == 1e-5
    for name in ("bert-base", "bert-large"):
        assert CATALOGUE[name].norm_eps == 1e-12
    assert not any(m.unapplied_rope_scaling for m in CATALOGUE.values())


LLAMA31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}


def test_import_llama31_rope_scaling(tmp_path, recwarn):
    """Llama 3.1's config (rope_scaling of type llama3, under rope_type or the older type key, or Transformers 5's
    rope_parameters holding rope_theta too) gives the catalogue's llama3-405b rotary fields, without a warning."""
    cfg = dict(LLAMA3_8B, max_position_embeddings=131072, rope_scaling=LLAMA31_SCALING)
    older = dict(cfg, rope_scaling={**{k: v for k, v in LLAMA31_SCALING.items() if k != "rope_type"}, "type": "llama3"})
    v5 = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = dict(LLAMA31_SCALING, rope_theta=500000.0)
    want = CATALOGUE["llama3-405b"]
    for i, c in enumerate((cfg, older, v5)):
        m = from_hf_config(_write(tmp_path, c, f"c{i}.json"))
        assert (m.rope_theta, m.norm_eps, m.rope_scaling_factor, m.rope_low_freq_factor, m.rope_high_freq_factor,
                m.rope_original_max_positions, m.unapplied_rope_scaling) == \
            (want.rope_theta, want.norm_eps, 8.0, 1.0, 4.0, 8192, ""), i
    assert not recwarn.list
    plain = from_hf_config(_write(tmp_path, dict(LLAMA3_8B, rope_scaling=None), "plain.json"))
    assert (plain.rope_theta, plain.rope_scaling_factor) == (500000.0, 0.0)
    with pytest.raises(PlanError, match="lacks the key 'low_freq_factor'"):
        from_hf_config(_write(tmp_path, dict(cfg, rope_scaling={"rope_type": "llama3", "factor": 8.0}), "bad.json"))


def test_import_qwen2_rotary_base_and_norm_eps(tmp_path):
    """Qwen2-0.5B's config: rope_theta 1e6, rms_norm_eps 1e-6. A config without the keys: theta 10000, eps 1e-5."""
    m = from_hf_config(_write(tmp_path, dict(QWEN2_05B, rope_theta=1000000.0, rms_norm_eps=1e-6, rope_scaling=None)))
    assert (m.rope_theta, m.norm_eps, m.rope_scaling_factor) == (1e6, 1e-6, 0.0)
    m = from_hf_config(_write(tmp_path, QWEN2_05B, "bare.json"))
    assert (m.rope_theta, m.norm_eps) == (10000.0, 1e-5)
    neox_style = from_hf_config(_write(tmp_path, dict(MISTRAL_7B, rotary_emb_base=20000), "base.json"))
    assert neox_style.rope_theta == 20000.0


def test_import_norm_eps_keys(tmp_path):
    assert from_hf_config(_write(tmp_path, GPT2)).norm_eps == 1e-5
    assert from_hf_config(_write(tmp_path, dict(GPT2, layer_norm_epsilon=1e-6), "g.json")).norm_eps == 1e-6
    assert from_hf_config(_write(tmp_path, BERT_BASE, "b.json")).norm_eps == 1e-12
    assert from_hf_config(_write(tmp_path, dict(BERT_BASE, layer_norm_eps=1e-7), "b7.json")).norm_eps == 1e-7
    with pytest.warns(UserWarning, match="plain GELU MLP"):
        assert from_hf_config(_write(tmp_path, dict(PHI2, layer_norm_eps=1e-6), "phi.json")).norm_eps == 1e-6
    starcoder2 = dict(PHI2, model_type="starcoder2", norm_epsilon=2e-5)
    with pytest.warns(UserWarning, match="plain GELU MLP"):
        assert from_hf_config(_write(tmp_path, starcoder2, "sc.json")).norm_eps == 2e-5


def test_import_yarn_scaling_is_read_without_it_and_warned(tmp_path):
    """Qwen2.5's long-context recipe (rope_scaling yarn): not applied by the runtime, so a warning says the model
    trains without it; the spec records it for the export. On the command line the warning is one 'warning:' line."""
    cfg = dict(QWEN2_05B, rope_theta=1000000.0, rms_norm_eps=1e-6,
               rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    p = _write(tmp_path, cfg)
    with pytest.warns(UserWarning, match="rope_scaling of type 'yarn' is not applied by parallel-plan's runtime, "
                                         "which trains without it"):
        m = from_hf_config(p)
    assert (m.unapplied_rope_scaling, m.rope_scaling_factor, m.rope_theta) == ("yarn", 0.0, 1e6)
    for kind in ("linear", "dynamic", "longrope"):
        with pytest.warns(UserWarning, match=f"type '{kind}'"):
            m = from_hf_config(_write(tmp_path, dict(cfg, rope_scaling={"rope_type": kind, "factor": 2.0}), f"{kind}.json"))
        assert m.unapplied_rope_scaling == kind
    rc, _, err = run_cli("--model", p, "--gpus", "1", "--global-batch", "8", "--seq-len", "512")
    assert rc == 0, err
    assert f"warning: model config '{p}': its rope_scaling of type 'yarn' is not applied" in err
    assert "(plain rotary at rope_theta 1000000)" in err and "Traceback" not in err


@pytest.mark.parametrize("over,needle", [
    (dict(rope_theta=0.0), "rope_theta must be a positive number"),
    (dict(rope_theta=float("inf")), "rope_theta must be a positive number"),
    (dict(rope_theta="500000"), "rope_theta must be a positive number"),
    (dict(norm_eps=-1e-5), "norm_eps must be a positive number"),
    (dict(norm_eps=float("nan")), "norm_eps must be a positive number"),
    (dict(norm_eps=True), "norm_eps must be a positive number"),
    (dict(rope_scaling_factor=-8.0), "rope_scaling_factor must be 0 (none) or a positive number"),
    (dict(rope_low_freq_factor=1.0, rope_original_max_positions=8192),
     "rope_low_freq_factor, rope_original_max_positions set without rope_scaling_factor"),
    (dict(rope_scaling_factor=8.0, rope_low_freq_factor=4.0, rope_high_freq_factor=4.0, rope_original_max_positions=8),
     "needs 0 < rope_low_freq_factor < rope_high_freq_factor"),
    (dict(rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_positions=0),
     "rope_original_max_positions must be a positive integer"),
    (dict(unapplied_rope_scaling=None), "unapplied_rope_scaling must be a string"),
])
def test_bad_rotary_and_norm_fields_are_refused(over, needle):
    with pytest.raises(PlanError) as e:
        ModelSpec.from_dict(dict(tiny_model("llama").to_dict(), **over))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_rotary_positions_need_an_even_head_dimension():
    """The runtime rotates a head's two halves against each other: a head of 9 dimensions cannot be built (a hidden
    of 36 over 4 heads, or an override), while a learned-position model of the same shape can."""
    with pytest.raises(PlanError, match="rotary positions need an even head dimension, got 9"):
        ModelSpec.from_dict(dict(tiny_model("llama").to_dict(), hidden=36, num_heads=4, num_kv_heads=2))
    with pytest.raises(PlanError, match="rotary positions need an even head dimension, got 15"):
        ModelSpec.from_dict(dict(tiny_model("llama").to_dict(), head_dim_override=15))
    assert ModelSpec.from_dict(dict(tiny_model("gpt").to_dict(), hidden=36, num_heads=4, num_kv_heads=4)).head_dim == 9


def test_rope_scaling_needs_rotary_positions():
    scaling = dict(rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_max_positions=8192)
    with pytest.raises(PlanError, match="rope_scaling_factor is set but the model has learned positions"):
        ModelSpec.from_dict(dict(tiny_model("gpt").to_dict(), **scaling))
    assert ModelSpec.from_dict(dict(tiny_model("llama").to_dict(), **scaling)).rope_scaling_factor == 8.0


@pytest.mark.parametrize("extra", [
    {"layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]},  # Qwen3-Next
    {"full_attention_interval": 4, "linear_num_value_heads": 32},
    {"layers_block_type": ["mamba", "attention"]},                                                    # Jamba
])
def test_import_layers_that_are_not_attention_are_refused(tmp_path, extra):
    with pytest.raises(PlanError, match="layers that are not softmax attention .*which parallel-plan does not model"):
        from_hf_config(_write(tmp_path, dict(LLAMA3_8B, **extra)))


def test_import_sliding_window_attention_is_warned(tmp_path):
    """Windowed attention is read as full attention (the runtime and the cost model attend over the whole
    sequence), with a warning that says so; a window the config switches off, or none, says nothing."""
    with pytest.warns(UserWarning, match="sliding_window 4096; parallel-plan trains and prices full attention"):
        from_hf_config(_write(tmp_path, dict(LLAMA3_8B, model_type="mistral", sliding_window=4096)))
    with pytest.warns(UserWarning, match="2 of its 3 layers use sliding-window attention"):
        from_hf_config(_write(tmp_path, dict(LLAMA3_8B, layer_types=["sliding_attention", "sliding_attention",
                                                                       "full_attention"]), "gemma.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_hf_config(_write(tmp_path, dict(QWEN2_05B, sliding_window=32768, use_sliding_window=False), "q.json"))
        from_hf_config(_write(tmp_path, dict(LLAMA3_8B, sliding_window=None), "none.json"))


def test_hf_model_name_does_not_depend_on_how_the_path_is_spelled(tmp_path, monkeypatch):
    """A config.json is named by its folder, another file by its stem, whether the path is relative or absolute:
    `plan --model qwen.json` and `plan --model /abs/dir/qwen.json` plan the same model under the same name (the
    plan file, results CSVs and calibration hold-outs match models by it)."""
    other = _write(tmp_path, QWEN2_05B, "qwen.json")
    hub = _write(tmp_path, QWEN2_05B)
    monkeypatch.chdir(hub.parent)
    for p in (other, "qwen.json", "./qwen.json", "../model/qwen.json"):
        assert from_hf_config(Path(p)).name == "qwen", p
    for p in (hub, "config.json", "./config.json", "../model/config.json"):
        assert from_hf_config(Path(p)).name == "model", p
