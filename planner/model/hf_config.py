"""A ModelSpec from a Hugging Face config.json: the families whose layers the runtime builds, and one sentence for
a config it cannot model."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from planner.errors import PlanError, read_json
from planner.hf_checks import (HF_READING_FAMILY, check_hf_config, gelu_approximate, hf_model_name, hf_reading,
                               known_types)
from planner.model.families import family_of
from planner.model.spec import ModelSpec, validate_model


def _first(cfg: dict, *keys, default=None):
    """The value of the first of `keys` the config sets (not None), else `default`."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


QKV_BIAS_PREFIXES = ("qwen2",)
"""Model types (prefixes) whose q, k and v projections have biases and whose output projection has none (Qwen2,
Qwen2-MoE, Qwen2-VL's language model: Hugging Face builds them with bias=True, whatever the config says)."""


QK_NORM_TYPES = ("qwen3", "qwen3_moe")
"""Model types whose attention RMS-normalises each head of q and k before rotary (Hugging Face Qwen3 and Qwen3-MoE
build q_norm and k_norm whatever the config says): ModelSpec.qk_norm. Exact types, not a prefix: OLMo2 normalises
the whole q and k projections instead, and Qwen3-Next's attention is another design."""


def _unmodelled_layer_kinds(cfg: dict) -> str:
    """Why a config's layers are not all softmax attention ('' when they are): linear-attention or state-space layers
    (Qwen3-Next's Gated DeltaNet, Mamba hybrids such as Jamba), named by their layer_types or their own keys."""
    kinds = sorted({str(k) for k in (cfg.get("layer_types") or cfg.get("layers_block_type") or [])
                    if any(word in str(k).lower() for word in ("linear", "mamba", "ssm", "recurrent"))})
    keys = [k for k in ("linear_num_value_heads", "full_attention_interval", "attn_layer_period", "mamba_d_state")
            if k in cfg]
    return "; ".join(([f"layer kinds {kinds}"] if kinds else []) + ([f"keys {keys}"] if keys else []))


def _sliding_window(cfg: dict) -> str:
    """Why some attention of a config is windowed ('' when none is): a sliding_window in use (Mistral 7B v0.1,
    Gemma 2/3) or sliding layers among its layer_types. The runtime and the cost model attend over the whole
    sequence."""
    layer_kinds = [str(k) for k in (cfg.get("layer_types") or [])]
    if any("sliding" in k for k in layer_kinds):
        return f"{sum('sliding' in k for k in layer_kinds)} of its {len(layer_kinds)} layers use sliding-window attention"
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        return f"sliding_window {cfg['sliding_window']}"
    return ""


def _dense_layers_among_experts(cfg: dict) -> str:
    """Why some layers of a Qwen MoE config keep a dense MLP ('' when none do): Hugging Face's Qwen2-MoE and Qwen3-MoE
    make layer i an MoE layer unless i is in mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = sorted(int(i) for i in (cfg.get("mlp_only_layers") or []))
    return "; ".join(([f"decoder_sparse_step {step}"] if step > 1 else [])
                     + ([f"mlp_only_layers {only}"] if only else []))


def _attention_biases(cfg: dict, model_type: str) -> tuple[bool, bool]:
    """(qkv_bias, attn_out_bias) of a Llama-style config. Qwen2 types: q, k, v biases unless the config says
    otherwise (an explicit qkv_bias or attention_bias key). Others: attention_bias true puts biases on q, k, v and
    the output projection (Hugging Face's LlamaAttention and the models built after it); a qkv_bias key on q, k, v."""
    if model_type.startswith(QKV_BIAS_PREFIXES):
        return bool(_first(cfg, "qkv_bias", "attention_bias", default=True)), False
    out = bool(_first(cfg, "attention_bias", default=False))
    return bool(_first(cfg, "qkv_bias", default=out)), out


def _norm_eps(cfg: dict, family: str) -> float:
    """The norms' epsilon of a config (its key differs by model type); absent: the family's default_norm_eps."""
    default = family_of(family).default_norm_eps
    return float(_first(cfg, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", default=default))


def _rotary(cfg: dict, path) -> dict:
    """The rotary fields of ModelSpec from a rotary model's config: rope_theta (rotary_emb_base in some configs;
    inside rope_parameters in Transformers 5's) and a rope_scaling of type llama3 (Llama 3.1). Another scaling
    type is left out, with a warning, and recorded in unapplied_rope_scaling."""
    params = cfg.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    theta = float(_first(cfg, "rope_theta", "rotary_emb_base", default=params.get("rope_theta", 10000.0)))
    out = {"rope_theta": theta}
    scaling = cfg.get("rope_scaling") or params
    if not isinstance(scaling, dict):
        raise TypeError(f"rope_scaling is {scaling!r}, not an object")
    kind = str(_first(scaling, "rope_type", "type", default="default")).lower()
    if kind == "llama3":
        out.update(rope_scaling_factor=float(scaling["factor"]),
                   rope_low_freq_factor=float(scaling["low_freq_factor"]),
                   rope_high_freq_factor=float(scaling["high_freq_factor"]),
                   rope_original_max_positions=int(scaling["original_max_position_embeddings"]))
    elif kind != "default":
        out["unapplied_rope_scaling"] = kind
        warnings.warn(f"model config '{path}': its rope_scaling of type '{kind}' is not applied by parallel-plan's "
                      f"runtime, which trains without it (plain rotary at rope_theta {theta:.10g}); `plan export --to "
                      "megatron` leaves it out too and says so", stacklevel=4)
    return out


def _bert_spec(cfg: dict, name: str, model_type: str, path, family: str) -> ModelSpec:
    """BERT's keys (hidden_size, num_hidden_layers, ...): tied output layer, 512 positions unless said."""
    hidden = int(cfg["hidden_size"])
    seq = int(cfg.get("max_position_embeddings", 512))
    return ModelSpec(name=name, family=family, num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                     num_heads=int(cfg["num_attention_heads"]), num_kv_heads=int(cfg["num_attention_heads"]),
                     ffn_hidden=int(cfg.get("intermediate_size", 4 * hidden)), vocab_size=int(cfg["vocab_size"]),
                     max_seq_len=seq, default_seq_len=seq, default_global_batch=256, tie_embeddings=True,
                     norm_eps=_norm_eps(cfg, family),
                     gelu_approximate=gelu_approximate(cfg, "bert", f"model config '{path}'"))


def _plain_mlp_spec(cfg: dict, name: str, model_type: str, path, family: str) -> ModelSpec:
    """hidden_size keys of a model with a plain GELU MLP (PLAIN_MLP_TYPES), read as a GPT-style model (warned)."""
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv = _first(cfg, "num_key_value_heads", "num_kv_heads", default=1 if cfg.get("multi_query") else heads)
    seq = int(_first(cfg, "max_position_embeddings", default=2048))
    spec = ModelSpec(name=name, family=family, num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                     num_heads=heads, num_kv_heads=int(kv),
                     ffn_hidden=int(_first(cfg, "intermediate_size", "ffn_dim", "ffn_hidden_size", default=4 * hidden)),
                     vocab_size=int(cfg["vocab_size"]), max_seq_len=seq, default_seq_len=min(seq, 4096),
                     default_global_batch=1024,
                     # Hugging Face ties by default; phi and gpt_neox configs say they do not
                     tie_embeddings=bool(cfg.get("tie_word_embeddings", model_type not in ("phi", "gpt_neox"))),
                     norm_eps=_norm_eps(cfg, family))
    warnings.warn(f"model config '{path}': model_type '{model_type}' has a plain GELU MLP and is read as a "
                  "GPT-style model (layers, widths, heads and vocabulary as given; its positions and residual "
                  "wiring priced as GPT's learned positions and sequential residual); `plan launch` refuses to train "
                  "it",
                  stacklevel=3)
    return spec


def _gpt2_spec(cfg: dict, name: str, model_type: str, path, family: str) -> ModelSpec:
    """GPT-2's keys (n_embd, n_layer, n_head, n_positions): tied output layer unless said."""
    hidden = int(cfg["n_embd"])
    seq = int(_first(cfg, "n_positions", "n_ctx", default=1024))
    return ModelSpec(name=name, family=family, num_layers=int(cfg["n_layer"]), hidden=hidden,
                     num_heads=int(cfg["n_head"]), num_kv_heads=int(cfg["n_head"]),
                     ffn_hidden=int(_first(cfg, "n_inner", default=4 * hidden)),
                     vocab_size=int(cfg["vocab_size"]), max_seq_len=seq, default_seq_len=seq,
                     default_global_batch=1024, tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                     norm_eps=_norm_eps(cfg, family),
                     gelu_approximate=gelu_approximate(cfg, "gpt2", f"model config '{path}'"))


def _refuse_unmodelled_layers(cfg: dict, path, experts: int) -> None:
    """One sentence for a Llama-style config whose layers the spec's one kind of layer cannot describe (latent
    attention and dense leading layers, non-attention layers, dense layers among MoE ones); a warning for
    sliding-window attention (priced and trained as full attention)."""
    if "kv_lora_rank" in cfg or int(cfg.get("first_k_dense_replace") or 0) > 0:
        # DeepSeek V2/V3: latent attention and dense first layers; counting them as plain layers would
        # misprice memory and time
        raise PlanError(f"model config '{path}' has multi-head latent attention or dense leading layers "
                        "(DeepSeek), which parallel-plan does not model")
    other_layers = _unmodelled_layer_kinds(cfg)
    if other_layers:
        # a linear-attention or state-space layer has other weights, memory and time than attention
        raise PlanError(f"model config '{path}' has layers that are not softmax attention ({other_layers}: "
                        "Qwen3-Next, Mamba hybrids), which parallel-plan does not model")
    window = _sliding_window(cfg)
    if window:
        warnings.warn(f"model config '{path}': {window}; parallel-plan trains and prices full attention over "
                      "the whole sequence instead", stacklevel=4)
    dense = _dense_layers_among_experts(cfg) if experts > 1 else ""
    if dense:
        # a dense layer among MoE ones has other weights, memory and time; the spec has one kind of layer
        raise PlanError(f"model config '{path}' keeps dense MLP layers among its MoE layers ({dense}), "
                        "which parallel-plan does not model")


def _moe_fields(cfg: dict, model_type: str, experts: int) -> dict:
    """The MoE fields of ModelSpec from a Llama-style config with `experts` experts (1: dense, no top-k or shared
    experts; the loss, routing and capacity fields are read whatever the count)."""
    shared_ffn = int(_first(cfg, "shared_expert_intermediate_size", default=0) or 0)
    if not shared_ffn and int(cfg.get("n_shared_experts") or 0) > 0:
        shared_ffn = int(cfg["n_shared_experts"]) * int(cfg["moe_intermediate_size"])
    return dict(num_experts=experts,
                top_k=int(_first(cfg, "num_experts_per_tok", default=1)) if experts > 1 else 1,
                shared_expert_ffn=shared_ffn if experts > 1 else 0,
                # Qwen gates its shared expert (shared_expert_gate, a [1, hidden] linear)
                shared_expert_gate=bool(shared_ffn and experts > 1 and "shared_expert_intermediate_size" in cfg),
                moe_aux_loss_coeff=float(_first(cfg, "router_aux_loss_coef", default=0.01)),
                # Qwen MoE configs carry norm_topk_prob (False by default there); Mixtral always renormalises
                moe_normalize_topk=bool(cfg.get("norm_topk_prob", not model_type.startswith("qwen"))),
                moe_capacity_factor=float(_first(cfg, "capacity_factor", default=0.0) or 0.0))


def _llama_style_spec(cfg: dict, name: str, model_type: str, path, family: str) -> ModelSpec:
    """hidden_size keys of a gated-MLP model (Llama, Mistral, Mixtral, Qwen, ...): grouped-query attention, MoE,
    attention biases, Qwen3's q/k norms and the rotary fields as the config gives them."""
    heads = int(cfg["num_attention_heads"])
    exact, prefixes = known_types()
    if model_type not in exact and not model_type.startswith(prefixes):
        warnings.warn(f"model config '{path}': model_type '{model_type}' is not one parallel-plan knows; read "
                      "as a Llama-style model (gated MLP, rotary, RMSNorm)", stacklevel=3)
    experts = int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=1))
    _refuse_unmodelled_layers(cfg, path, experts)
    moe = _moe_fields(cfg, model_type, experts)
    max_seq = int(_first(cfg, "max_position_embeddings", default=4096))
    hidden = int(cfg["hidden_size"])
    head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
    ffn = int(_first(cfg, "moe_intermediate_size", default=0) if experts > 1 else 0) or int(cfg["intermediate_size"])
    qkv_bias, attn_out_bias = _attention_biases(cfg, model_type)
    return ModelSpec(name=name, family=family, num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                     num_heads=heads, num_kv_heads=int(_first(cfg, "num_key_value_heads", default=heads)),
                     ffn_hidden=ffn, vocab_size=int(cfg["vocab_size"]), max_seq_len=max_seq,
                     default_seq_len=min(max_seq, 4096), default_global_batch=512,
                     **moe,
                     tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                     head_dim_override=head_dim if head_dim * heads != hidden else 0,
                     qkv_bias=qkv_bias, attn_out_bias=attn_out_bias, qk_norm=model_type in QK_NORM_TYPES,
                     norm_eps=_norm_eps(cfg, family),
                     **_rotary(cfg, path))


def _gemma_spec(cfg: dict, name: str, model_type: str, path, family: str) -> ModelSpec:
    """Gemma (v1): Llama-style keys (head_dim as given: Gemma 7B's 256 x 16 heads exceed its hidden 3072), tied
    output layer unless said (transformers' GemmaConfig default), its GeGLU's GELU form."""
    cfg = dict(cfg, tie_word_embeddings=cfg.get("tie_word_embeddings", True))
    spec = _llama_style_spec(cfg, name, model_type, path, family)
    return dataclasses.replace(spec, gelu_approximate=gelu_approximate(cfg, "gemma", f"model config '{path}'"))


_READERS = {"bert": _bert_spec, "plain_mlp": _plain_mlp_spec, "gpt2": _gpt2_spec, "gemma": _gemma_spec,
            "llama_style": _llama_style_spec}
"""The ModelSpec of a config by its reading (planner/hf_checks.py hf_reading), of the family HF_READING_FAMILY gives."""


def from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json: llama/mistral/mixtral/qwen keys, gemma's, gpt2 keys or BERT keys; the plain-MLP
    types of PLAIN_MLP_TYPES as GPT-style models (warned). The spec records the config's model_type
    (ModelSpec.hf_model_type)."""
    cfg = read_json(path, "model config")
    if not isinstance(cfg, dict):
        raise PlanError(f"model config '{path}' is not a JSON object")
    name, model_type = hf_model_name(path), str(cfg.get("model_type", "")).lower()
    check_hf_config(cfg, model_type, path)  # model types and features the runtime builds
    reading = hf_reading(cfg, model_type)
    try:
        spec = dataclasses.replace(_READERS[reading](cfg, name, model_type, path, HF_READING_FAMILY[reading]),
                                   hf_model_type=model_type)
    except KeyError as exc:
        raise PlanError(f"model config '{path}' lacks the key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise PlanError(f"model config '{path}' has a value of the wrong type ({exc})") from None
    except ZeroDivisionError:
        raise PlanError(f"model config '{path}' gives 0 attention heads") from None
    validate_model(spec)
    return spec
