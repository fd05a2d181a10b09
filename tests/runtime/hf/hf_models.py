"""Tiny `transformers` models of every model type the runtime loads, and their reference forward and backward on
CPU in fp32: what tests/runtime/hf/test_hf_weights.py compares the runtime with."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from planner.model import from_hf_config
from runtime.model import IGNORE_INDEX

SEQ, BATCH = 16, 2
COMMON = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
"""Vocabulary 300 pads to 384 rows (ModelSpec.padded_vocab): TP rank 1's rows run past the real vocabulary."""


def hf_config(model_type: str):
    """A tiny config of model_type with every feature its family has (biases, q/k norms, scaling, experts)."""
    import transformers as T
    if model_type == "llama":
        return T.LlamaConfig(**COMMON, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                         high_freq_factor=4.0, original_max_position_embeddings=16))
    if model_type == "mistral":
        return T.MistralConfig(**COMMON, sliding_window=None, rms_norm_eps=1e-6)
    if model_type == "qwen2":
        return T.Qwen2Config(**COMMON, use_sliding_window=False)
    if model_type == "qwen3":
        return T.Qwen3Config(**COMMON, head_dim=16, use_sliding_window=False)
    if model_type == "mixtral":
        return T.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)
    if model_type == "qwen3_moe":
        return T.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                norm_topk_prob=True)
    if model_type == "phi3":
        return T.Phi3Config(**COMMON)
    if model_type == "gpt2":
        return T.GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
                            eos_token_id=2)
    if model_type == "bert":  # BERT's own exact (erf) GELU, hidden_act "gelu"
        return T.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, hidden_act="gelu",
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if model_type == "gemma":  # head_dim 16 x 4 heads exceeds hidden 32, as Gemma 7B's 256 x 16 exceeds 3072
        return T.GemmaConfig(**COMMON, head_dim=16, hidden_act="gelu_pytorch_tanh")
    raise ValueError(model_type)


def make_hf_model(model_type: str, folder: Path, seed: int = 0, max_shard_size=None):
    """A random tiny model of model_type, saved (safetensors; sharded with an index where max_shard_size is given,
    e.g. "20KB") to folder; returns the model (fp32, eval mode)."""
    import transformers as T
    torch.manual_seed(seed)
    cfg = hf_config(model_type)
    cls = T.AutoModelForMaskedLM if model_type == "bert" else T.AutoModelForCausalLM
    model = cls.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():  # nonzero biases and norm weights, so a dropped or misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return model


def batch(spec, seed: int = 5) -> dict:
    """tokens and labels [BATCH, SEQ] (BERT: masked positions and token types)."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(3, spec.vocab_size, (BATCH, SEQ + 1), generator=g)
    if spec.family == "bert":
        tokens = seq[:, :SEQ].clone()
        chosen = torch.rand(tokens.shape, generator=g) < 0.3
        chosen[:, 0] = True
        labels = torch.where(chosen, tokens, torch.full_like(tokens, IGNORE_INDEX))
        tokens[chosen] = 4
        types = (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ).contiguous()
        return dict(tokens=tokens, labels=labels, token_types=types)
    return dict(tokens=seq[:, :-1].contiguous(), labels=seq[:, 1:].contiguous())


@dataclass
class Reference:
    """transformers' logits [BATCH, SEQ, vocab], mean loss over labelled tokens, and gradients by tensor name."""
    logits: torch.Tensor
    loss: float
    grads: dict


def reference(model, spec, data: dict, grad_names) -> Reference:
    """transformers' forward and backward on data (fp32): the loss is the mean cross-entropy of labelled tokens."""
    model.zero_grad()
    kw = {"token_type_ids": data["token_types"]} if "token_types" in data else {}
    logits = model(input_ids=data["tokens"], **kw).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), data["labels"].reshape(-1),
                           ignore_index=IGNORE_INDEX)
    loss.backward()
    params = dict(model.named_parameters())
    grads = {n: params[n].grad.detach().clone() for n in grad_names if n in params and params[n].grad is not None}
    return Reference(logits.detach(), float(loss.detach()), grads)


def spec_of(folder: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_hf_config(Path(folder) / "config.json")
