"""Parameter and FLOP counts of the catalogue and of hand-checked tiny models (config.json import: test_hf_config.py)."""
from __future__ import annotations


import pytest

from planner.model import CATALOGUE, tiny_model

# Published totals. Llama 3 / Mixtral / BERT counts are the exact figures of the released checkpoints
# (HF `num_parameters()`; BERT as BertForMaskedLM, no pooler): the tolerance only absorbs rounding of
# the quoted figure. GPT sizes are the GPT-3 paper's nominal ones (Brown et al. 2020, table 2.1), quoted
# to 2 digits and with a different vocabulary (50257 there, Megatron's padded 50304 here): 2%.
PUBLISHED = [
    # name, total, active, relative tolerance
    ("llama3-8b", 8_030_261_248, None, 1e-6),
    ("llama3-70b", 70_553_706_496, None, 1e-6),
    ("llama3-405b", 405.8e9, None, 5e-4),
    ("mixtral-8x7b", 46_702_792_704, 12.9e9, 5e-3),
    ("mixtral-8x22b", 140_630_071_296, 39.1e9, 5e-3),
    ("bert-base", 109_514_298, None, 1e-6),
    ("bert-large", 335_174_458, None, 1e-6),
    ("gpt-1.3b", 1.3e9, None, 0.02),
    ("gpt-6.7b", 6.7e9, None, 0.02),
    ("gpt-13b", 13.0e9, None, 0.02),
    ("gpt-175b", 175.0e9, None, 0.02),
]


@pytest.mark.parametrize("name,total,active,tol", PUBLISHED)
def test_catalogue_matches_published_counts(name, total, active, tol):
    m = CATALOGUE[name]
    pad = m.vocab_padding_params()  # rows the runtime allocates beyond the vocabulary (ModelSpec.padded_vocab)
    assert m.total_params() - pad == pytest.approx(total, rel=tol)
    if active is None:
        assert m.active_params() == m.total_params()
    else:
        assert m.active_params() - pad == pytest.approx(active, rel=tol)


def test_bert_vocabulary_padding_counted_by_hand():
    """BERT-base: 30,522 ids padded to 30,592 rows; tied decoder, so one [70, 768] block plus 70 decoder biases."""
    m = CATALOGUE["bert-base"]
    assert m.padded_vocab == 30592
    assert m.vocab_padding_params() == 70 * 768 + 70


def test_catalogue_has_the_issue_models():
    for name in ("gpt-1.3b", "gpt-6.7b", "gpt-13b", "gpt-70b", "gpt-175b", "llama3-8b", "llama3-70b",
                 "llama3-405b", "mixtral-8x7b", "mixtral-8x22b", "bert-base", "bert-large"):
        assert name in CATALOGUE


# -- tiny models, counted by hand ---------------------------------------------------------------------
# All: 4 layers, hidden 64, 4 heads (head_dim 16), ffn 128, vocab 256, 64 positions.

def test_tiny_gpt_params_by_hand():
    m = tiny_model("gpt")  # LayerNorm with bias, GELU MLP with biases, learned positions, tied output
    norms = 2 * (64 + 64)                          # two LayerNorms (weight + bias)
    attn = (64 * 192 + 192) + (64 * 64 + 64)       # fused QKV + out projection, with biases
    mlp = (64 * 128 + 128) + (128 * 64 + 64)       # fc1 + fc2, with biases
    assert (norms, attn, mlp) == (256, 16640, 16576)
    assert m.layer_params() == 33472
    assert m.embedding_params() == 256 * 64 + 64 * 64 == 20480
    assert m.head_params() == 128                  # final LayerNorm only (tied)
    assert m.total_params() == 4 * 33472 + 20480 + 128 == 154496


def test_tiny_llama_params_by_hand():
    m = tiny_model("llama")  # RMSNorm, SwiGLU, no biases, GQA with 2 KV heads, untied output
    attn = 64 * (64 + 2 * 32) + 64 * 64            # q + k + v (kv width 32) + out
    mlp = 3 * 64 * 128
    assert m.layer_params() == 2 * 64 + attn + mlp == 36992
    assert m.embedding_params() == 256 * 64
    assert m.head_params() == 64 + 256 * 64
    assert m.total_params() == 180800


def test_tiny_qwen2_style_attention_biases_by_hand():
    """q/k/v biases (Qwen2): q width 64 + k, v widths 32 each per layer; Llama's attention_bias adds the output
    projection's [64]. On a TP2 rank the q/k/v bias is halved with its heads, the output bias is whole."""
    from planner.memory import layer_dense_params_local
    plain, qkv = tiny_model("llama"), tiny_model("llama", qkv_bias=True)
    both = tiny_model("llama", qkv_bias=True, attn_out_bias=True)
    attn = 64 * (64 + 2 * 32) + 64 * 64                    # q + k + v + out weights, as without biases
    assert plain.attention_params() == attn == 12288
    assert qkv.attention_params() == attn + (64 + 2 * 32) == 12416
    assert both.attention_params() == attn + 128 + 64 == 12480
    assert qkv.layer_params() == 2 * 64 + 12416 + 3 * 64 * 128 == 37120
    assert plain.total_params() == 180800
    assert qkv.total_params() == 180800 + 4 * 128 == 181312
    assert both.total_params() == 180800 + 4 * (128 + 64) == 181568
    tp2 = 64 * 128 / 2 + 64 * 64 / 2 + 2 * 64 + 3 * 64 * 128 / 2   # weights halved, norms whole
    assert layer_dense_params_local(plain, 2) == tp2
    assert layer_dense_params_local(qkv, 2) == tp2 + 128 / 2
    assert layer_dense_params_local(both, 2) == tp2 + 128 / 2 + 64
    # FLOPs are the GEMMs' only
    assert qkv.model_flops_per_token(32) == both.model_flops_per_token(32) == plain.model_flops_per_token(32)


def test_tiny_qwen3_style_qk_norm_by_hand():
    """Qwen3's q/k norms: a [head_dim] RMSNorm weight for q and one for k per layer. With head_dim 24 (not 64 / 4):
    q width 96, k and v 48 each; on a TP2 rank the projections halve and the two norm weights stay whole, among the
    tensors whose gradients are summed over TP."""
    from planner.memory import layer_dense_params_local, tp_replicated_tensors
    m = tiny_model("llama", qk_norm=True, head_dim_override=24)
    assert (m.head_dim, m.q_width, m.kv_width, m.qk_norm_params()) == (24, 96, 48, 48)
    attn = 64 * (96 + 2 * 48) + 96 * 64 + 2 * 24           # q + k + v, out, q_norm + k_norm
    assert m.attention_params() == attn == 18480
    assert m.layer_params() == 2 * 64 + attn + 3 * 64 * 128 == 43184
    assert m.total_params() == 4 * 43184 + 256 * 64 + (64 + 256 * 64) == 205568
    without = tiny_model("llama", head_dim_override=24)
    assert m.total_params() - without.total_params() == 4 * 2 * 24
    assert layer_dense_params_local(m, 2) == 64 * 192 / 2 + 96 * 64 / 2 + 2 * 24 + 2 * 64 + 3 * 64 * 128 / 2
    assert (8, 24) in tp_replicated_tensors(m, 1, 4, False, False)   # 2 per layer x 4 layers
    assert (8, 24) not in tp_replicated_tensors(without, 1, 4, False, False)
    assert m.model_flops_per_token(32) == without.model_flops_per_token(32)  # FLOPs are the GEMMs' only


def test_tiny_moe_params_by_hand():
    m = tiny_model("llama", num_experts=4, top_k=2)
    expert = 3 * 64 * 128
    layer = 2 * 64 + 12288 + 4 * expert + 64 * 4    # norms, attention, 4 experts, router
    assert m.layer_params() == layer == 110976
    assert m.total_params() == 4 * layer + 16384 + 16448 == 476736
    # one token touches the router, attention, norms and 2 of the 4 experts
    assert m.active_params() == 4 * (layer - 2 * expert) + 16384 + 16448 == 280128


def test_tiny_bert_params_by_hand():
    m = tiny_model("bert")
    emb = 256 * 64 + 64 * 64 + 2 * 64 + 2 * 64     # tokens, positions, 2 token types, LayerNorm
    head = 64 * 64 + 64 + 2 * 64 + 256             # MLM transform dense + LayerNorm, tied decoder's bias
    assert m.embedding_params() == emb == 20736
    assert m.head_params() == head == 4544
    assert m.total_params() == 4 * 33472 + emb + head == 159168


def test_flops_per_token_by_hand():
    m = tiny_model("gpt")
    seq = 32
    layer_mm = 2 * 64 * 192 + 2 * 64 * 64 + 2 * 64 * 128 + 2 * 128 * 64   # QKV, out, fc1, fc2
    assert m.layer_matmul_flops_per_token() == layer_mm == 65536
    attn = 2 * seq * 64 + 2 * seq * 64                                      # QK^T and AV, full (not halved)
    assert m.attention_core_flops_per_token(seq, causal_halved=False) == attn == 8192
    assert m.attention_core_flops_per_token(seq, causal_halved=True) == attn / 2
    head = 2 * 64 * 256
    assert m.model_flops_per_token(seq) == 3 * (4 * (layer_mm + attn) + head) == 983040


def test_moe_flops_count_top_k_experts_and_router():
    m = tiny_model("llama", num_experts=4, top_k=2)
    attn = 2 * 64 * 128 + 2 * 64 * 64
    assert m.layer_matmul_flops_per_token() == attn + 2 * (2 * 3 * 64 * 128) + 2 * 64 * 4


def test_flops_close_to_6n_for_a_large_dense_model():
    m = CATALOGUE["llama3-70b"]
    # 6 N plus attention (12 L h s): the usual estimate, within the embedding lookup's share
    est = 6 * m.total_params() + 12 * m.num_layers * m.hidden * 8192
    assert m.model_flops_per_token(8192) == pytest.approx(est, rel=0.02)
