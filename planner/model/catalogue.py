"""The catalogue of named models (GPT, Llama-style, MoE, BERT), the tiny models the tests and probes build, and
resolve_model: a catalogue name or a Hugging Face config.json."""
from __future__ import annotations

from pathlib import Path

from planner.errors import PlanError
from planner.model.hf_config import from_hf_config
from planner.model.families import BERT_NORM_EPS, family_of
from planner.model.spec import ModelSpec, validate_model


def _gpt(name, layers, hidden, heads, seq=2048, gb=1024, vocab=50304):
    return ModelSpec(name=name, family="gpt", num_layers=layers, hidden=hidden, num_heads=heads,
                     num_kv_heads=heads, ffn_hidden=4 * hidden, vocab_size=vocab, max_seq_len=seq,
                     default_seq_len=seq, default_global_batch=gb, tie_embeddings=True)


def _llama(name, layers, hidden, heads, kv, ffn, vocab, max_seq, seq, gb, theta, experts=1, top_k=1, **rope_scaling):
    return ModelSpec(name=name, family="llama", num_layers=layers, hidden=hidden, num_heads=heads,
                     num_kv_heads=kv, ffn_hidden=ffn, vocab_size=vocab, max_seq_len=max_seq,
                     default_seq_len=seq, default_global_batch=gb, num_experts=experts, top_k=top_k,
                     rope_theta=theta, **rope_scaling)


def _bert(name, layers, hidden, heads):
    return ModelSpec(name=name, family="bert", num_layers=layers, hidden=hidden, num_heads=heads,
                     num_kv_heads=heads, ffn_hidden=4 * hidden, vocab_size=30522, max_seq_len=512,
                     default_seq_len=512, default_global_batch=256, tie_embeddings=True, norm_eps=BERT_NORM_EPS)


LLAMA31_ROPE_SCALING = dict(rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                            rope_original_max_positions=8192)
"""Llama 3.1's rope_scaling (its config.json: rope_type llama3, factor 8, low 1, high 4, original 8192)."""


# Shapes from the models' papers / released configs. GPT sizes follow GPT-3 (Brown et al. 2020) with
# Megatron's padded GPT-2 vocabulary (50304); gpt-70b is the GPT-3 recipe at 88 layers x 8192 (70.9B).
# Default batches: GPT 1024 x 2048 (2M tokens), Llama 3 512 x 8192 (4M; 405B 2048 x 8192 = 16M as
# Meta trained it), Mixtral 1024 x 4096 (4M), BERT 256 x 512 (Devlin et al.).
# Rotary bases and norm epsilons as the released config.json files give them: Llama 3 rope_theta 500000 (405B is
# Llama 3.1 and scales its rotary frequencies), Mixtral 1e6, every rms_norm_eps 1e-5; GPT's LayerNorm 1e-5 (Megatron's
# default), BERT's 1e-12.
CATALOGUE: dict[str, ModelSpec] = {m.name: m for m in [
    _gpt("gpt-1.3b", 24, 2048, 16),
    _gpt("gpt-6.7b", 32, 4096, 32),
    _gpt("gpt-13b", 40, 5120, 40),
    _gpt("gpt-70b", 88, 8192, 64),
    _gpt("gpt-175b", 96, 12288, 96),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 8192, 512, theta=500000.0),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 8192, 512, theta=500000.0),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 8192, 2048, theta=500000.0,
           **LLAMA31_ROPE_SCALING),
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, 4096, 1024, theta=1e6, experts=8, top_k=2),
    _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 65536, 4096, 1024, theta=1e6, experts=8, top_k=2),
    _bert("bert-base", 12, 768, 12),
    _bert("bert-large", 24, 1024, 16),
]}


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalogue name, or a path to a Hugging Face config.json (or a folder holding one)."""
    if name_or_path in CATALOGUE:
        return CATALOGUE[name_or_path]
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        return from_hf_config(p)
    raise PlanError(f"unknown model '{name_or_path}'; known models: {', '.join(CATALOGUE)} "
                    "(or give the path of a Hugging Face config.json)")


def tiny_model(family: str = "gpt", **over) -> ModelSpec:
    """A model of `family` small enough for CPU tests of every parallel layout (divisible by 2 and 4 everywhere); its
    key/value heads, tying and norm epsilon are the family's (ModelFamily.tiny_kv_heads, default_tie_embeddings,
    default_norm_eps) unless `over` sets them."""
    fam = family_of(family)
    base = dict(name=f"tiny-{family}", family=family, num_layers=4, hidden=64, num_heads=4,
                num_kv_heads=fam.tiny_kv_heads, ffn_hidden=128, vocab_size=256, max_seq_len=64, default_seq_len=32,
                default_global_batch=8, tie_embeddings=fam.default_tie_embeddings, norm_eps=fam.default_norm_eps)
    base.update(over)
    spec = ModelSpec(**base)
    validate_model(spec)
    return spec
