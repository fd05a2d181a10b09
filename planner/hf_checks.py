"""What a Hugging Face config.json must be before planner/model/hf_config.py reads it: a model type the runtime builds, no
feature that changes cost or numerics and that the runtime does not build, numbers finite and in range.

Refused by name, in one sentence each: encoder-decoder models (T5, BART, ...), state-space and recurrent models
(Mamba, RWKV: their layers are not attention), a model type parallel-plan does not know, attention or final logit
soft-capping (Gemma 2), the extra norms around Gemma 2 / 3's and OLMo 2's blocks, Granite's multipliers, a
Llama-style gated MLP whose activation is not SiLU or that has biases (mlp_bias), rotary over part of each head
(partial_rotary_factor; the plain-MLP types, planned as approximations, keep theirs), a Gemma, GPT-2 or BERT MLP
whose activation is not GELU (gelu_approximate reads the GELU's form: tanh or exact erf), a decoder made
bidirectional. Nothing is left out
without a word; what is read is what the runtime trains and the cost model prices."""
from __future__ import annotations

import os
from pathlib import Path

from planner.errors import PlanError
from planner.limits import (MAX_EXPERTS, MAX_FFN, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, is_number,
                            is_whole)
from planner.shell_safe import safe_model_name

ENCODER_DECODER_TYPES = ("t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus", "pegasus_x",
                         "marian", "blenderbot", "blenderbot-small", "led", "prophetnet", "fsmt", "whisper", "m2m_100",
                         "nllb-moe", "encoder-decoder", "plbart", "bigbird_pegasus", "seamless_m4t")
STATE_SPACE_TYPES = ("mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "recurrent_gemma", "xlstm")
EXTRA_NORM_TYPES = ("gemma2", "gemma3", "gemma3_text", "olmo2")
"""Gemma 2 / 3: RMSNorm before and after the feed-forward block and after attention (four norms per layer where
the runtime builds two), besides their soft-capping and sliding windows; OLMo 2: norms after attention and after the
feed-forward block instead of before, and q/k norms over the whole projection."""
SILU = ("silu", "swish")
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
"""Hugging Face activation names of GELU's tanh approximation (ModelSpec.gelu_approximate 'tanh')."""
ERF_GELU = ("gelu", "gelu_python")
"""Hugging Face activation names of the exact (erf) GELU (ModelSpec.gelu_approximate 'none')."""

PLAIN_MLP_TYPES = ("phi", "gpt_neox", "falcon", "starcoder2", "opt")
"""Hugging Face model types with hidden_size keys whose MLP is plain (up, GELU, down: two matrices), not gated: read
as GPT-style models, with a warning. As Llama-style ones their MLPs would count a third matrix (phi-2: 3.6B
parameters against its 2.7B). Their rotary / ALiBi positions and parallel residuals are not modelled."""

APPROXIMATED_TYPES = PLAIN_MLP_TYPES
"""Model types that are planned but that the runtime would train as another architecture: phi, gpt_neox, falcon,
starcoder2 and opt are built as GPT-style models (learned positions, sequential residual; theirs have rotary or ALiBi
positions, parallel residuals, other norms). `plan launch` refuses them (refuse_approximated_model_type), reading the
type a plan records (ModelSpec.hf_model_type), and so does loading or saving their weights (runtime/hf)."""


def refuse_approximated_model_type(model_type: str) -> None:
    """Refuse, in one sentence, to train a model type whose architecture the runtime only approximates (planning it
    with the planner's warning stays allowed)."""
    model_type = str(model_type or "").lower()
    if model_type in APPROXIMATED_TYPES:
        raise PlanError(f"model_type '{model_type}' is planned with an approximated architecture that parallel-plan's "
                        "runtime does not build exactly (its positions, residual wiring or norms differ), so "
                        "`plan launch` refuses to train it")

LLAMA_STYLE_TYPES = ("mistral", "mixtral", "gemma2", "phi3", "olmo", "internlm2", "yi", "")
LLAMA_STYLE_PREFIXES = ("llama", "qwen", "deepseek")
"""Model types (and prefixes) read as Llama-style (gated MLP, rotary, RMSNorm) without a warning; another unknown
type with hidden_size keys is read so too, with a warning."""
GEMMA_TYPES = ("gemma",)
"""Gemma (v1): the gemma family (GeGLU, (1 + weight) RMSNorm, sqrt(hidden)-scaled embedding, tied output layer);
Gemma 2 / 3 are refused (EXTRA_NORM_TYPES, soft-capping)."""

MULTIPLIER_KEYS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
"""Granite's scalings of the embedding, residual branches, attention scores and logits: numerics the runtime does not
build."""

INT_KEYS = {  # key: (lower bound, upper bound)
    "num_hidden_layers": (1, MAX_LAYERS), "n_layer": (1, MAX_LAYERS),
    "hidden_size": (1, MAX_HIDDEN), "n_embd": (1, MAX_HIDDEN),
    "num_attention_heads": (1, MAX_HEADS), "n_head": (1, MAX_HEADS), "num_key_value_heads": (1, MAX_HEADS),
    "num_kv_heads": (1, MAX_HEADS), "head_dim": (1, MAX_HIDDEN),
    "intermediate_size": (1, MAX_FFN), "n_inner": (1, MAX_FFN), "ffn_dim": (1, MAX_FFN),
    "moe_intermediate_size": (1, MAX_FFN), "shared_expert_intermediate_size": (0, MAX_FFN),
    "vocab_size": (1, MAX_VOCAB), "max_position_embeddings": (1, MAX_SEQ_LEN), "n_positions": (1, MAX_SEQ_LEN),
    "n_ctx": (1, MAX_SEQ_LEN), "num_local_experts": (1, MAX_EXPERTS), "num_experts": (1, MAX_EXPERTS),
    "n_routed_experts": (1, MAX_EXPERTS), "num_experts_per_tok": (1, MAX_EXPERTS), "n_shared_experts": (0, MAX_EXPERTS),
}
FLOAT_KEYS = ("rope_theta", "rotary_emb_base", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon",
              "router_aux_loss_coef", "capacity_factor")
BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "qkv_bias", "norm_topk_prob", "multi_query",
             "use_sliding_window", "use_bidirectional_attention", "is_encoder_decoder")
"""Switches planner/model/hf_config.py reads: JSON true or false (a string "false" would read as true)."""


def hf_model_name(path) -> str:
    """The model's name from its config's path, made safe for any export: a config.json is named by its folder (the
    hub's layout), another file by its stem; the same either way the path is spelled (relative or absolute)."""
    path = Path(os.path.abspath(path))  # '..' and '.' resolved by name, links not followed
    return safe_model_name((path.parent.name if path.name == "config.json" else "") or path.stem)


HF_READING_FAMILY = {"bert": "bert", "plain_mlp": "gpt", "gpt2": "gpt", "gemma": "gemma", "llama_style": "llama"}
"""The model family (planner/model/families.py) each way of reading a config (hf_reading) gives its ModelSpec."""


def hf_reading(cfg: dict, model_type: str) -> str:
    """Which keys planner/model/hf_config.py reads a config by, the one rule it and check_hf_config share: 'bert'
    (BERT's keys: model_type bert or a type_vocab_size key), 'plain_mlp' (PLAIN_MLP_TYPES: hidden_size keys, a
    plain GELU MLP), 'gpt2' (GPT-2's n_embd keys), 'gemma' (GEMMA_TYPES: Llama-style keys, Gemma's layer) or
    'llama_style' (hidden_size keys, a gated MLP: every other type). HF_READING_FAMILY gives each its family."""
    if model_type == "bert" or "type_vocab_size" in cfg:
        return "bert"
    if model_type in PLAIN_MLP_TYPES:
        return "plain_mlp"
    if model_type in GEMMA_TYPES:
        return "gemma"
    if "n_embd" in cfg or model_type == "gpt2":
        return "gpt2"
    return "llama_style"


def known_types() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(exact model types, prefixes) that planner/model/hf_config.py reads."""
    return ("bert", "gpt2") + PLAIN_MLP_TYPES + GEMMA_TYPES + LLAMA_STYLE_TYPES, LLAMA_STYLE_PREFIXES


def check_hf_config(cfg: dict, model_type: str, path) -> None:
    """Refuses, in one sentence naming the config, what the runtime does not build (see the module's docstring)."""
    where = f"model config '{path}'"
    if model_type in ENCODER_DECODER_TYPES or cfg.get("is_encoder_decoder") is True:
        raise PlanError(f"{where}: model_type '{model_type}' is an encoder-decoder model; parallel-plan builds "
                        "decoder-only models (GPT, Llama-style) and BERT encoders")
    if model_type in STATE_SPACE_TYPES:
        raise PlanError(f"{where}: model_type '{model_type}' has state-space (recurrent) layers, which are not "
                        "attention; parallel-plan builds transformer layers only")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            raise PlanError(f"{where}: {key} {cfg[key]!r} soft-caps logits (Gemma 2), which parallel-plan's runtime "
                            "does not build; planning it as uncapped would train another model")
    if model_type in EXTRA_NORM_TYPES:
        raise PlanError(f"{where}: model_type '{model_type}' has extra norms before and after each feed-forward block "
                        "and after attention, which parallel-plan's runtime does not build")
    multipliers = [k for k in MULTIPLIER_KEYS if cfg.get(k) not in (None, 1, 1.0)]
    if multipliers:
        raise PlanError(f"{where}: {', '.join(multipliers)} scale the model's activations (Granite), which "
                        "parallel-plan's runtime does not build; planning it without them would train another model")
    exact, prefixes = known_types()
    reading = hf_reading(cfg, model_type)
    if reading == "llama_style" and model_type not in exact and not model_type.startswith(prefixes):
        raise PlanError(f"{where}: model_type '{model_type}' is not one parallel-plan builds; it reads "
                        f"{', '.join(t for t in exact if t and t not in EXTRA_NORM_TYPES)} and {', '.join(p + '*' for p in prefixes)}")
    if reading == "llama_style":
        act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu").lower()
        if act not in SILU:
            raise PlanError(f"{where}: its gated MLP uses the activation '{act}' (GeGLU and the like); the runtime's "
                            "Llama-style gated MLP is SwiGLU (SiLU), so it is refused rather than planned or exported "
                            "as --swiglu")
    if reading in ("llama_style", "gemma") and cfg.get("mlp_bias") is True:
        raise PlanError(f"{where}: mlp_bias true puts biases on the gated MLP's projections, which parallel-plan's "
                        "runtime does not build; planning it without them would train another model")
    if reading in ("llama_style", "gemma") and cfg.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise PlanError(f"{where}: partial_rotary_factor {cfg['partial_rotary_factor']!r} rotates part of each head, "
                        "where parallel-plan's runtime rotates all of it; planning it so would train another model")
    if cfg.get("use_bidirectional_attention"):
        raise PlanError(f"{where}: use_bidirectional_attention makes its decoder attend both ways, which "
                        "parallel-plan's runtime does not build")
    if reading in ("gemma", "gpt2", "bert"):
        gelu_approximate(cfg, reading, where)
    check_hf_numbers(cfg, where)


def gelu_approximate(cfg: dict, reading: str, where: str) -> str:
    """The GELU form of a config read as 'gemma', 'gpt2' or 'bert' (hf_reading), as ModelSpec.gelu_approximate
    names it: 'tanh' or 'none' (exact erf); another activation is refused in one sentence. The keys and defaults are
    transformers': GPT-2's activation_function (gelu_new), BERT's hidden_act (gelu, the erf form), Gemma's
    hidden_activation else hidden_act (gelu_pytorch_tanh; its legacy "gelu" means the tanh form, as
    transformers' GemmaConfig reads it)."""
    if reading == "gpt2":
        act = cfg.get("activation_function") or "gelu_new"
    elif reading == "gemma":
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        act = "gelu_pytorch_tanh" if str(act).lower() == "gelu" else act
    else:
        act = cfg.get("hidden_act") or "gelu"
    act = str(act).lower()
    if act in TANH_GELU:
        return "tanh"
    if act in ERF_GELU:
        return "none"
    raise PlanError(f"{where}: its MLP uses the activation '{act}'; parallel-plan's runtime computes GELU (the tanh "
                    f"form: {', '.join(TANH_GELU)}; the exact form: {', '.join(ERF_GELU)}) there")


def check_hf_numbers(cfg: dict, where: str) -> None:
    """Whole-number keys within their bounds (a layer count of 1e12 would keep the search busy for minutes), float
    keys finite, switches true or false."""
    for key, (lo, hi) in INT_KEYS.items():
        v = cfg.get(key)
        if v is None:
            continue
        if not is_whole(v):
            raise PlanError(f"{where}: {key} must be a whole number, got {v!r}")
        if not lo <= v <= hi:
            raise PlanError(f"{where}: {key} {v!r} is outside {lo}..{hi}, the range parallel-plan plans for")
    for key in FLOAT_KEYS:
        v = cfg.get(key)
        if v is not None and not is_number(v):
            raise PlanError(f"{where}: {key} must be a finite number, got {v!r}")
    for key in BOOL_KEYS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, bool):
            raise PlanError(f"{where}: {key} must be true or false, got {v!r}")
