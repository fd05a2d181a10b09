"""Where each runtime parameter lives in a Hugging Face checkpoint, per model type.

A runtime parameter is named by its logical (TP1) name (runtime/model.py: `layers.3.attn.qkv.weight`,
`layers.3.mlp.experts.5.w_gate`, ...). Its logical tensor is a concatenation, along its TP dimension (dim 0 where it
has none), of Pieces: each one Hugging Face tensor, or a row range of one, in the runtime's orientation. The fused
q/k/v projection is [q; k; v], the gated MLP's fc1 is [gate; up]: one Piece per fused part, in the order of the
parameter's `tp_parts`, so that the TP shard of rank r is chunk r of every Piece (runtime/parallel/tensor.py,
local_shard). The vocabulary's rows are padded to ModelSpec.padded_vocab with zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import PlanError
from planner.model import ModelSpec


@dataclass(frozen=True)
class Piece:
    """One fused part of a runtime parameter, read from one Hugging Face tensor."""
    hf_name: str
    rows: tuple[int, int] | None = None
    """[start, end) of the Hugging Face tensor's rows (in the runtime's orientation) that form this part; None: all."""
    transpose: bool = False
    """The Hugging Face tensor is stored [in, out] (GPT-2's Conv1D); the runtime's linear weights are [out, in]."""
    pad_rows: int = 0
    """Rows of the part after zero padding (the padded vocabulary); 0: as many as read."""


LLAMA_LIKE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "qwen2_moe", "phi3", "gemma")
"""Model types whose Hugging Face tensors map onto the runtime's Llama-style layers exactly (tested against
`transformers` in tests/runtime/hf/test_hf_weights.py). Gemma's norm weights are stored as the offset from one, as
the runtime's (1 + weight) norms keep them (ModelFamily.norm_unit_offset)."""
SUPPORTED_TYPES = LLAMA_LIKE_TYPES + ("gpt2", "bert")


def hf_sources(spec: ModelSpec, model_type: str) -> dict[str, tuple[Piece, ...]]:
    """Every logical runtime parameter of `spec` -> its Pieces, for a checkpoint of `model_type`."""
    if model_type == "gpt2":
        return _gpt2(spec)
    if model_type == "bert":
        return _bert(spec)
    if model_type in LLAMA_LIKE_TYPES:
        return _llama_like(spec, model_type)
    raise PlanError(f"model_type '{model_type}' has no Hugging Face weight mapping in parallel-plan's runtime; it maps "
                    f"{', '.join(SUPPORTED_TYPES)}")


def _one(name: str, pad_rows: int = 0) -> tuple[Piece, ...]:
    return (Piece(name, pad_rows=pad_rows),)


def _llama_like(spec: ModelSpec, model_type: str) -> dict[str, tuple[Piece, ...]]:
    out = {"embedding.word.weight": _one("model.embed_tokens.weight", spec.padded_vocab),
           "head.norm.weight": _one("model.norm.weight")}
    if not spec.tie_embeddings:
        out["head.output.weight"] = _one("lm_head.weight", spec.padded_vocab)
    for i in range(spec.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        out[ours + "attn_norm.weight"] = _one(hf + "input_layernorm.weight")
        out[ours + "mlp_norm.weight"] = _one(hf + "post_attention_layernorm.weight")
        out.update(_llama_attention(spec, model_type, hf + "self_attn.", ours + "attn."))
        if spec.is_moe:
            out.update(_moe(spec, model_type, hf, ours + "mlp."))
        elif model_type == "phi3":  # [gate; up] fused in one tensor, as the runtime keeps them
            f = spec.ffn_hidden
            out[ours + "mlp.fc1.weight"] = (Piece(hf + "mlp.gate_up_proj.weight", (0, f)),
                                            Piece(hf + "mlp.gate_up_proj.weight", (f, 2 * f)))
            out[ours + "mlp.fc2.weight"] = _one(hf + "mlp.down_proj.weight")
        else:
            out[ours + "mlp.fc1.weight"] = (Piece(hf + "mlp.gate_proj.weight"), Piece(hf + "mlp.up_proj.weight"))
            out[ours + "mlp.fc2.weight"] = _one(hf + "mlp.down_proj.weight")
    return out


def _llama_attention(spec: ModelSpec, model_type: str, hf: str, ours: str) -> dict[str, tuple[Piece, ...]]:
    q, kv = spec.q_width, spec.kv_width
    out = {}
    if model_type == "phi3":  # [q; k; v] fused in one tensor
        out[ours + "qkv.weight"] = tuple(Piece(hf + "qkv_proj.weight", r) for r in ((0, q), (q, q + kv),
                                                                                   (q + kv, q + 2 * kv)))
    else:
        out[ours + "qkv.weight"] = tuple(Piece(hf + f"{x}_proj.weight") for x in "qkv")
    if spec.has_qkv_bias:
        out[ours + "qkv.bias"] = tuple(Piece(hf + f"{x}_proj.bias") for x in "qkv")
    out[ours + "proj.weight"] = _one(hf + "o_proj.weight")
    if spec.has_attn_out_bias:
        out[ours + "proj.bias"] = _one(hf + "o_proj.bias")
    if spec.qk_norm:
        out[ours + "q_norm"] = _one(hf + "q_norm.weight")
        out[ours + "k_norm"] = _one(hf + "k_norm.weight")
    return out


def _moe(spec: ModelSpec, model_type: str, hf: str, ours: str) -> dict[str, tuple[Piece, ...]]:
    """Router, experts (keyed by their global index) and shared experts: Mixtral's block_sparse_moe (w1 gate, w3 up,
    w2 down), Qwen's mlp.experts (gate_proj, up_proj, down_proj) and mlp.shared_expert(_gate)."""
    out = {}
    if model_type == "mixtral":
        moe = hf + "block_sparse_moe."
        names = ("w1", "w3", "w2")
        expert = lambda e, w: f"{moe}experts.{e}.{w}.weight"  # noqa: E731
    else:
        moe = hf + "mlp."
        names = ("gate_proj", "up_proj", "down_proj")
        expert = lambda e, w: f"{moe}experts.{e}.{w}.weight"  # noqa: E731
    out[ours + "router.weight"] = _one(moe + "gate.weight")
    for e in range(spec.num_experts):
        for ours_w, hf_w in zip(("w_gate", "w_up", "w_down"), names):
            out[f"{ours}experts.{e}.{ours_w}"] = _one(expert(e, hf_w))
    if spec.shared_expert_ffn:
        for ours_w, hf_w in zip(("w_gate", "w_up", "w_down"), ("gate_proj", "up_proj", "down_proj")):
            out[f"{ours}shared.{ours_w}"] = _one(f"{moe}shared_expert.{hf_w}.weight")
        if spec.shared_expert_gate:
            out[ours + "shared.gate"] = _one(moe + "shared_expert_gate.weight")
    return out


def _gpt2(spec: ModelSpec) -> dict[str, tuple[Piece, ...]]:
    h = spec.hidden
    out = {"embedding.word.weight": _one("transformer.wte.weight", spec.padded_vocab),
           "embedding.position": _one("transformer.wpe.weight"),
           "head.norm.weight": _one("transformer.ln_f.weight"), "head.norm.bias": _one("transformer.ln_f.bias")}
    if not spec.tie_embeddings:
        out["head.output.weight"] = _one("lm_head.weight", spec.padded_vocab)
    for i in range(spec.num_layers):
        hf, ours = f"transformer.h.{i}.", f"layers.{i}."
        for norm, ln in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            out[f"{ours}{norm}.weight"] = _one(f"{hf}{ln}.weight")
            out[f"{ours}{norm}.bias"] = _one(f"{hf}{ln}.bias")
        thirds = ((0, h), (h, 2 * h), (2 * h, 3 * h))
        out[ours + "attn.qkv.weight"] = tuple(Piece(hf + "attn.c_attn.weight", r, transpose=True) for r in thirds)
        out[ours + "attn.qkv.bias"] = tuple(Piece(hf + "attn.c_attn.bias", r) for r in thirds)
        for ours_l, hf_l in (("attn.proj", "attn.c_proj"), ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
            out[f"{ours}{ours_l}.weight"] = (Piece(f"{hf}{hf_l}.weight", transpose=True),)
            out[f"{ours}{ours_l}.bias"] = _one(f"{hf}{hf_l}.bias")
    return out


def _bert(spec: ModelSpec) -> dict[str, tuple[Piece, ...]]:
    emb = "bert.embeddings."
    out = {"embedding.word.weight": _one(emb + "word_embeddings.weight", spec.padded_vocab),
           "embedding.position": _one(emb + "position_embeddings.weight"),
           "embedding.token_type": _one(emb + "token_type_embeddings.weight"),
           "embedding.norm.weight": _one(emb + "LayerNorm.weight"), "embedding.norm.bias": _one(emb + "LayerNorm.bias"),
           "head.dense": _one("cls.predictions.transform.dense.weight"),
           "head.dense_bias": _one("cls.predictions.transform.dense.bias"),
           "head.norm.weight": _one("cls.predictions.transform.LayerNorm.weight"),
           "head.norm.bias": _one("cls.predictions.transform.LayerNorm.bias"),
           "head.decoder_bias": _one("cls.predictions.bias", spec.padded_vocab)}
    if not spec.tie_embeddings:
        out["head.output.weight"] = _one("cls.predictions.decoder.weight", spec.padded_vocab)
    for i in range(spec.num_layers):
        hf, ours = f"bert.encoder.layer.{i}.", f"layers.{i}."
        att = hf + "attention."
        out[ours + "attn.qkv.weight"] = tuple(Piece(f"{att}self.{x}.weight") for x in ("query", "key", "value"))
        out[ours + "attn.qkv.bias"] = tuple(Piece(f"{att}self.{x}.bias") for x in ("query", "key", "value"))
        pairs = (("attn.proj", att + "output.dense"), ("attn_norm", att + "output.LayerNorm"),
                 ("mlp.fc1", hf + "intermediate.dense"), ("mlp.fc2", hf + "output.dense"),
                 ("mlp_norm", hf + "output.LayerNorm"))
        for ours_l, hf_l in pairs:
            out[f"{ours}{ours_l}.weight"] = _one(hf_l + ".weight")
            out[f"{ours}{ours_l}.bias"] = _one(hf_l + ".bias")
    return out
