"""Model specs: the catalogue, Hugging Face config.json import, and exact parameter and FLOP counts.

One `ModelSpec` describes every model the planner and the runtime know, its layer's parts given by its family's
traits (planner/model/families.py): GPT (LayerNorm, GELU MLP, learned positions), Llama-style (RMSNorm, SwiGLU,
rotary, grouped-query attention; Qwen3's per-head q/k norms where `qk_norm` says), Mixtral/Qwen-style MoE (the MLP
replaced by `num_experts` experts with top-k routing) and the BERT encoder (bidirectional attention, masked-LM head).
The runtime builds its modules from the same spec, so the counts here are the counts of the tensors it allocates
(tests check this against `sum(p.numel())`).

Modules: families (ModelFamily: each family's layer parts as traits, and the registry: FAMILIES, register_family,
family_of), spec (ModelSpec, its counts and validation), catalogue (the named models, tiny test models, resolve_model),
hf_config (a ModelSpec from a Hugging Face config.json).
"""
from planner.model.catalogue import CATALOGUE, resolve_model, tiny_model
from planner.model.families import FAMILIES, ModelFamily, family_of, register_family
from planner.model.hf_config import from_hf_config
from planner.model.spec import BERT_NORM_EPS, ModelSpec, validate_model

__all__ = ["BERT_NORM_EPS", "CATALOGUE", "FAMILIES", "ModelFamily", "ModelSpec", "family_of", "from_hf_config",
           "register_family", "resolve_model", "tiny_model", "validate_model"]
