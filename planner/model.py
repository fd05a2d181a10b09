"""Model specs: the catalogue, Hugging Face config.json import, and exact parameter and FLOP counts.

One `ModelSpec` describes every model the planner and the runtime know: GPT (LayerNorm, GELU MLP,
learned positions), Llama-style (RMSNorm, SwiGLU, rotary, grouped-query attention; Qwen3's per-head q/k norms
where `qk_norm` says), Mixtral/Qwen-style
MoE (the MLP replaced by `num_experts` experts with top-k routing) and the BERT encoder (bidirectional
attention, masked-LM head). The runtime builds its modules from the same spec, so the counts here are
the counts of the tensors it allocates (tests check this against `sum(p.numel())`).
"""
from __future__ import annotations

import math
import warnings

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from planner.errors import PlanError, read_json


BERT_NORM_EPS = 1e-12
"""BERT's LayerNorm epsilon (Devlin et al.'s release; Hugging Face BertConfig.layer_norm_eps)."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    """'gpt' (decoder, LayerNorm, GELU, learned positions), 'llama' (decoder, RMSNorm, SwiGLU, rotary)
    or 'bert' (encoder: bidirectional attention, token types, masked-LM head)."""
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads; equal to num_heads for multi-head attention, fewer for GQA."""
    ffn_hidden: int
    """Inner width of the MLP (of each expert for MoE)."""
    vocab_size: int
    max_seq_len: int
    """Longest sequence the model supports (size of the learned position table for GPT/BERT)."""
    default_seq_len: int
    """Training sequence length used when the user gives no --seq-len."""
    default_global_batch: int
    """Global batch in sequences used when the user gives no --global-batch."""
    num_experts: int = 1
    """1 for a dense MLP; >1 replaces each MLP by that many experts (MoE)."""
    top_k: int = 1
    """Experts each token is routed to (MoE only)."""
    shared_expert_ffn: int = 0
    """Inner width of the shared experts, all of them together (MoE only; Qwen's shared_expert_intermediate_size,
    DeepSeek's n_shared_experts x moe_intermediate_size): one SwiGLU MLP every token goes through beside its
    routed experts. 0: none."""
    shared_expert_gate: bool = False
    """The shared experts' output scaled per token by sigmoid(x . w), w one [hidden] weight per layer (Qwen)."""
    moe_aux_loss_coeff: float = 0.01
    """Weight of the load-balancing loss in the training loss (MoE only; Hugging Face router_aux_loss_coef,
    Megatron --moe-aux-loss-coeff)."""
    moe_normalize_topk: bool = True
    """Renormalise the top-k routing weights to sum to one (Mixtral does; Qwen MoE configs say norm_topk_prob)."""
    moe_capacity_factor: float = 0.0
    """0: dropless, every assignment computed. Else each expert takes at most capacity x tokens x top_k / experts
    assignments per rank-local batch and drops the rest (Megatron --moe-expert-capacity-factor). The cost model
    prices the dropless work, an upper bound."""
    tie_embeddings: bool = False
    """Output layer shares the input embedding's weight."""
    head_dim_override: int = 0
    """Per-head width when it is not hidden // num_heads (0: hidden // num_heads)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections of a Llama-style model (Qwen2 and Qwen2-MoE always have them; Llama-family
    configs with attention_bias true). GPT and BERT have them whatever this says (has_bias)."""
    attn_out_bias: bool = False
    """A bias on the attention's output projection of a Llama-style model (Llama-family attention_bias true, with
    qkv_bias). GPT and BERT have it whatever this says (has_bias)."""
    qk_norm: bool = False
    """Qwen3's q/k norms (Llama-style models only): after the q/k projections and before rotary, each head of q and
    of k is RMS-normalised over head_dim (epsilon norm_eps) and scaled by a [head_dim] weight shared across the heads,
    one for q (q_norm) and one for k (k_norm) per layer (Hugging Face qwen3 and qwen3_moe, Megatron --qk-layernorm).
    OLMo2's norms over the whole q and k projections are another thing, not this."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies: pair i of a head turns by position x rope_theta^(-2i / head_dim) (Hugging Face
    rope_theta, Megatron --rotary-base; Llama 3 500000, Mixtral and Qwen2 1e6). Meaningless for learned positions."""
    norm_eps: float = 1e-5
    """Epsilon of every LayerNorm / RMSNorm (Hugging Face rms_norm_eps / layer_norm_eps, Megatron --norm-epsilon;
    BERT 1e-12 (BERT_NORM_EPS), Qwen2 1e-6)."""
    rope_scaling_factor: float = 0.0
    """Llama 3.1's rotary frequency scaling (Hugging Face rope_scaling of type llama3): 0 for none, else the factor
    the low frequencies are divided by (Llama 3.1 8). The three fields below are set with it and 0 without it."""
    rope_low_freq_factor: float = 0.0
    """Llama 3.1 scaling: frequencies whose wavelength exceeds rope_original_max_positions / this are divided by the
    factor (Llama 3.1 1)."""
    rope_high_freq_factor: float = 0.0
    """Llama 3.1 scaling: frequencies whose wavelength is below rope_original_max_positions / this are kept (Llama 3.1
    4); those between the two bounds are interpolated."""
    rope_original_max_positions: int = 0
    """Llama 3.1 scaling: the context length the model was first trained at (Hugging Face
    original_max_position_embeddings; Llama 3.1 8192)."""
    unapplied_rope_scaling: str = ""
    """The type of a rope_scaling the source config asked for that the spec leaves out (linear, dynamic, yarn,
    longrope, ...): the runtime trains with plain rotary at rope_theta instead, and the Megatron export says so.
    '' when there is none (Llama 3.1's llama3 type is applied: rope_scaling_factor above)."""

    # -- derived structure -------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def causal(self) -> bool:
        return self.family != "bert"

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU (gate and up projections) rather than a plain GELU MLP."""
        return self.family == "llama"

    @property
    def has_bias(self) -> bool:
        """GPT-2/3 and BERT use biases in linear layers and norms; Llama-style models do not."""
        return self.family in ("gpt", "bert")

    @property
    def has_qkv_bias(self) -> bool:
        """The fused q/k/v projection has a bias (column-parallel: each TP rank holds its heads' part)."""
        return self.has_bias or self.qkv_bias

    @property
    def has_attn_out_bias(self) -> bool:
        """The attention's output projection has a bias (row-parallel: whole on every TP rank)."""
        return self.has_bias or self.attn_out_bias

    @property
    def learned_positions(self) -> bool:
        return self.family in ("gpt", "bert")

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    # -- parameter counts (elements) ---------------------------------------
    def norm_params(self) -> int:
        return 2 * self.hidden if self.has_bias else self.hidden

    def qk_norm_params(self) -> int:
        """The q and k norms' weights of one layer, [head_dim] each (whole on every TP rank)."""
        return 2 * self.head_dim if self.qk_norm else 0

    def attention_params(self) -> int:
        h, qkv_width = self.hidden, self.q_width + 2 * self.kv_width
        qkv = h * qkv_width + (qkv_width if self.has_qkv_bias else 0)
        out = self.q_width * h + (h if self.has_attn_out_bias else 0)
        return qkv + out + self.qk_norm_params()

    def expert_params(self) -> int:
        """One MLP (one expert for MoE)."""
        h, f = self.hidden, self.ffn_hidden
        if self.gated_mlp:
            return 3 * h * f
        return 2 * h * f + (f + h if self.has_bias else 0)

    def router_params(self) -> int:
        return self.hidden * self.num_experts if self.is_moe else 0

    def shared_expert_params(self) -> int:
        """The shared experts of one MoE layer (SwiGLU) and their gate."""
        if not self.shared_expert_ffn:
            return 0
        return 3 * self.hidden * self.shared_expert_ffn + (self.hidden if self.shared_expert_gate else 0)

    def mlp_params(self) -> int:
        return self.num_experts * self.expert_params() + self.router_params() + self.shared_expert_params()

    def layer_params(self) -> int:
        return 2 * self.norm_params() + self.attention_params() + self.mlp_params()

    def layer_dense_params(self) -> int:
        """Parameters of a layer that are not expert weights (replicated across expert-parallel ranks)."""
        return self.layer_params() - self.num_experts * self.expert_params() if self.is_moe else self.layer_params()

    def embedding_params(self) -> int:
        """Input side: token embedding, learned positions, BERT token types and embedding norm."""
        n = self.vocab_size * self.hidden
        if self.learned_positions:
            n += self.max_seq_len * self.hidden
        if self.family == "bert":
            n += 2 * self.hidden + self.norm_params()
        return n

    def head_params(self) -> int:
        """Output side: final norm (decoders), output projection unless tied, BERT's MLM transform."""
        h = self.hidden
        if self.family == "bert":
            # dense h->h + GELU + LayerNorm, then the tied decoder plus its bias
            n = h * h + h + self.norm_params() + self.vocab_size
            return n + (0 if self.tie_embeddings else self.vocab_size * h)
        n = self.norm_params()
        return n + (0 if self.tie_embeddings else self.vocab_size * h)

    def total_params(self) -> int:
        return self.num_layers * self.layer_params() + self.embedding_params() + self.head_params()

    def active_params(self) -> int:
        """Parameters touched by one token (MoE: top_k experts of each layer)."""
        if not self.is_moe:
            return self.total_params()
        per_layer = self.layer_dense_params() + self.top_k * self.expert_params()
        return self.num_layers * per_layer + self.embedding_params() + self.head_params()

    # -- FLOPs --------------------------------------------------------------
    def layer_matmul_flops_per_token(self) -> float:
        """Forward matmul FLOPs of one layer per token (MoE: top_k experts plus the router)."""
        h = self.hidden
        attn = 2 * h * (self.q_width + 2 * self.kv_width) + 2 * self.q_width * h
        mlp = self.top_k * 2 * (3 if self.gated_mlp else 2) * h * self.ffn_hidden + 2 * self.router_params() \
            + 2 * self.shared_expert_params()
        return attn + mlp

    def attention_core_flops_per_token(self, seq_len: int, causal_halved: bool) -> float:
        """Forward QK^T and AV FLOPs per token of one layer; halved for causal masks when asked."""
        f = 4.0 * seq_len * self.q_width
        return f / 2 if (causal_halved and self.causal) else f

    def head_matmul_flops_per_token(self) -> float:
        h = self.hidden
        f = 2 * h * self.vocab_size
        if self.family == "bert":
            f += 2 * h * h
        return f

    def model_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward) in the convention MFU is quoted in
        by Megatron-LM, PaLM and ../shared/anchors: attention scores counted in full (not halved for causal
        masks), no recompute counted. Used for MFU and TFLOP/s, never for predicting time."""
        fwd = self.num_layers * (self.layer_matmul_flops_per_token()
                                 + self.attention_core_flops_per_token(seq_len, causal_halved=False))
        fwd += self.head_matmul_flops_per_token()
        return 3.0 * fwd

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "ModelSpec":
        names = {f.name for f in fields(ModelSpec)}
        unknown = set(d) - names
        if unknown:
            raise PlanError(f"model spec has unknown fields {sorted(unknown)}")
        if "norm_eps" not in d and d.get("family") == "bert":
            # written before the spec had norm_eps, when the runtime gave BERT's norms 1e-12
            d = dict(d, norm_eps=BERT_NORM_EPS)
        try:
            spec = ModelSpec(**d)
        except TypeError as exc:
            raise PlanError(f"model spec is incomplete: {exc}") from None
        validate_model(spec)
        return spec


def validate_model(m: ModelSpec) -> None:
    """Reject specs no runtime could build, with one sentence naming the field."""
    if m.family not in ("gpt", "llama", "bert"):
        raise PlanError(f"model family '{m.family}' is not one of gpt, llama, bert")
    for name in ("num_layers", "hidden", "num_heads", "num_kv_heads", "ffn_hidden", "vocab_size",
                 "max_seq_len", "default_seq_len", "default_global_batch", "num_experts", "top_k"):
        v = getattr(m, name)
        if not isinstance(v, int) or v < 1:
            raise PlanError(f"model '{m.name}': {name} must be a positive integer, got {v!r}")
    if m.head_dim_override == 0 and m.hidden % m.num_heads:
        raise PlanError(f"model '{m.name}': hidden {m.hidden} is not divisible by {m.num_heads} heads")
    if m.num_heads % m.num_kv_heads:
        raise PlanError(f"model '{m.name}': {m.num_heads} heads are not divisible by {m.num_kv_heads} KV heads")
    if m.top_k > m.num_experts:
        raise PlanError(f"model '{m.name}': top_k {m.top_k} exceeds its {m.num_experts} experts")
    if isinstance(m.shared_expert_ffn, bool) or not isinstance(m.shared_expert_ffn, int) or m.shared_expert_ffn < 0:
        raise PlanError(f"model '{m.name}': shared_expert_ffn must be a whole number >= 0, got {m.shared_expert_ffn!r}")
    if (m.shared_expert_ffn or m.shared_expert_gate) and not (m.is_moe and m.gated_mlp):
        raise PlanError(f"model '{m.name}': shared experts are modelled for MoE models with SwiGLU experts only")
    if m.shared_expert_gate and not m.shared_expert_ffn:
        raise PlanError(f"model '{m.name}': shared_expert_gate is set but there are no shared experts")
    for name in ("moe_aux_loss_coeff", "moe_capacity_factor"):
        v = getattr(m, name)
        if not _is_number(v) or v < 0:
            raise PlanError(f"model '{m.name}': {name} must be a number >= 0, got {v!r}")
    for name in ("moe_normalize_topk", "qkv_bias", "attn_out_bias", "qk_norm"):
        if not isinstance(getattr(m, name), bool):
            raise PlanError(f"model '{m.name}': {name} must be true or false, got {getattr(m, name)!r}")
    if m.qk_norm and m.family != "llama":
        raise PlanError(f"model '{m.name}': qk_norm (per-head q/k RMSNorm before rotary) is modelled for Llama-style "
                        f"models only, not for family '{m.family}'")
    if not isinstance(m.unapplied_rope_scaling, str):
        raise PlanError(f"model '{m.name}': unapplied_rope_scaling must be a string, got {m.unapplied_rope_scaling!r}")
    for name in ("rope_theta", "norm_eps"):
        v = getattr(m, name)
        if not _is_number(v) or not v > 0:
            raise PlanError(f"model '{m.name}': {name} must be a positive number, got {v!r}")
    if not _is_number(m.rope_scaling_factor) or m.rope_scaling_factor < 0:
        raise PlanError(f"model '{m.name}': rope_scaling_factor must be 0 (none) or a positive number, "
                        f"got {m.rope_scaling_factor!r}")
    if m.rope_scaling_factor == 0:
        scaling_set = [n for n in ("rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_positions")
                       if getattr(m, n) != 0]
        if scaling_set:
            raise PlanError(f"model '{m.name}': {', '.join(scaling_set)} set without rope_scaling_factor")
    else:
        lo, hi, orig = m.rope_low_freq_factor, m.rope_high_freq_factor, m.rope_original_max_positions
        if m.learned_positions:
            raise PlanError(f"model '{m.name}': rope_scaling_factor is set but the model has learned positions")
        if not (_is_number(lo) and _is_number(hi) and 0 < lo < hi):
            raise PlanError(f"model '{m.name}': rope scaling needs 0 < rope_low_freq_factor < rope_high_freq_factor, "
                            f"got {lo!r} and {hi!r}")
        if isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
            raise PlanError(f"model '{m.name}': rope_original_max_positions must be a positive integer with rope "
                            f"scaling, got {orig!r}")


def _is_number(v) -> bool:
    """A finite int or float (not a bool)."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


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


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


PLAIN_MLP_TYPES = ("phi", "gpt_neox", "falcon", "starcoder2", "opt")
"""Hugging Face model types with hidden_size keys whose MLP is plain (up, GELU, down: two matrices), not gated: read
as GPT-style models, with a warning. As Llama-style ones their MLPs would count a third matrix (phi-2: 3.6B
parameters against its 2.7B). Their rotary / ALiBi positions and parallel residuals are not modelled."""

LLAMA_STYLE_TYPES = ("mistral", "mixtral", "gemma", "gemma2", "phi3", "olmo", "olmo2", "granite", "internlm2", "yi", "")
LLAMA_STYLE_PREFIXES = ("llama", "qwen", "deepseek")
"""Model types (and prefixes) read as Llama-style (gated MLP, rotary, RMSNorm) without a warning; another unknown
type with hidden_size keys is read so too, with a warning. (Gemma's gated GELU costs what SwiGLU does.)"""


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


def _norm_eps(cfg: dict, default: float = 1e-5) -> float:
    """The norms' epsilon of a config (its key differs by model type); absent: the spec's default (BERT's for BERT)."""
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
                      "megatron` leaves it out too and says so", stacklevel=3)
    return out


def from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json: llama/mistral/mixtral/qwen keys, gpt2 keys or BERT keys; the plain-MLP
    types of PLAIN_MLP_TYPES as GPT-style models (warned)."""
    cfg = read_json(path, "model config")
    if not isinstance(cfg, dict):
        raise PlanError(f"model config '{path}' is not a JSON object")
    from planner.hf_checks import check_hf_config, hf_model_name  # model types and features the runtime builds
    name, model_type = hf_model_name(path), str(cfg.get("model_type", "")).lower()
    check_hf_config(cfg, model_type, path)
    try:
        if model_type == "bert" or "type_vocab_size" in cfg:
            hidden = int(cfg["hidden_size"])
            seq = int(cfg.get("max_position_embeddings", 512))
            spec = ModelSpec(name=name, family="bert", num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                             num_heads=int(cfg["num_attention_heads"]), num_kv_heads=int(cfg["num_attention_heads"]),
                             ffn_hidden=int(cfg.get("intermediate_size", 4 * hidden)), vocab_size=int(cfg["vocab_size"]),
                             max_seq_len=seq, default_seq_len=seq, default_global_batch=256, tie_embeddings=True,
                             norm_eps=_norm_eps(cfg, BERT_NORM_EPS))
        elif model_type in PLAIN_MLP_TYPES:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            kv = _first(cfg, "num_key_value_heads", "num_kv_heads", default=1 if cfg.get("multi_query") else heads)
            seq = int(_first(cfg, "max_position_embeddings", default=2048))
            spec = ModelSpec(name=name, family="gpt", num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                             num_heads=heads, num_kv_heads=int(kv),
                             ffn_hidden=int(_first(cfg, "intermediate_size", "ffn_dim", "ffn_hidden_size",
                                                   default=4 * hidden)),
                             vocab_size=int(cfg["vocab_size"]), max_seq_len=seq, default_seq_len=min(seq, 4096),
                             default_global_batch=1024,
                             # Hugging Face ties by default; phi and gpt_neox configs say they do not
                             tie_embeddings=bool(cfg.get("tie_word_embeddings", model_type not in ("phi", "gpt_neox"))),
                             norm_eps=_norm_eps(cfg))
            warnings.warn(f"model config '{path}': model_type '{model_type}' has a plain GELU MLP and is read as a "
                          "GPT-style model (layers, widths, heads and vocabulary as given; its positions and residual "
                          "wiring priced as GPT's learned positions and sequential residual)", stacklevel=2)
        elif "n_embd" in cfg or model_type == "gpt2":
            hidden = int(cfg["n_embd"])
            seq = int(_first(cfg, "n_positions", "n_ctx", default=1024))
            spec = ModelSpec(name=name, family="gpt", num_layers=int(cfg["n_layer"]), hidden=hidden,
                             num_heads=int(cfg["n_head"]), num_kv_heads=int(cfg["n_head"]),
                             ffn_hidden=int(_first(cfg, "n_inner", default=4 * hidden)),
                             vocab_size=int(cfg["vocab_size"]), max_seq_len=seq, default_seq_len=seq,
                             default_global_batch=1024, tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                             norm_eps=_norm_eps(cfg))
        else:
            heads = int(cfg["num_attention_heads"])
            if model_type not in LLAMA_STYLE_TYPES and not model_type.startswith(LLAMA_STYLE_PREFIXES):
                warnings.warn(f"model config '{path}': model_type '{model_type}' is not one parallel-plan knows; read "
                              "as a Llama-style model (gated MLP, rotary, RMSNorm)", stacklevel=2)
            experts = int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=1))
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
                              "the whole sequence instead", stacklevel=2)
            dense = _dense_layers_among_experts(cfg) if experts > 1 else ""
            if dense:
                # a dense layer among MoE ones has other weights, memory and time; the spec has one kind of layer
                raise PlanError(f"model config '{path}' keeps dense MLP layers among its MoE layers ({dense}), "
                                "which parallel-plan does not model")
            shared_ffn = int(_first(cfg, "shared_expert_intermediate_size", default=0) or 0)
            if not shared_ffn and int(cfg.get("n_shared_experts") or 0) > 0:
                shared_ffn = int(cfg["n_shared_experts"]) * int(cfg["moe_intermediate_size"])
            max_seq = int(_first(cfg, "max_position_embeddings", default=4096))
            hidden = int(cfg["hidden_size"])
            head_dim = int(_first(cfg, "head_dim", default=hidden // heads))
            ffn = int(_first(cfg, "moe_intermediate_size", default=0) if experts > 1 else 0) or int(cfg["intermediate_size"])
            qkv_bias, attn_out_bias = _attention_biases(cfg, model_type)
            spec = ModelSpec(name=name, family="llama", num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                             num_heads=heads, num_kv_heads=int(_first(cfg, "num_key_value_heads", default=heads)),
                             ffn_hidden=ffn, vocab_size=int(cfg["vocab_size"]), max_seq_len=max_seq,
                             default_seq_len=min(max_seq, 4096), default_global_batch=512,
                             num_experts=experts, top_k=int(_first(cfg, "num_experts_per_tok", default=1)) if experts > 1 else 1,
                             shared_expert_ffn=shared_ffn if experts > 1 else 0,
                             # Qwen gates its shared expert (shared_expert_gate, a [1, hidden] linear)
                             shared_expert_gate=bool(shared_ffn and experts > 1 and "shared_expert_intermediate_size" in cfg),
                             moe_aux_loss_coeff=float(_first(cfg, "router_aux_loss_coef", default=0.01)),
                             # Qwen MoE configs carry norm_topk_prob (False by default there); Mixtral always renormalises
                             moe_normalize_topk=bool(cfg.get("norm_topk_prob", not model_type.startswith("qwen"))),
                             moe_capacity_factor=float(_first(cfg, "capacity_factor", default=0.0) or 0.0),
                             tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                             head_dim_override=head_dim if head_dim * heads != hidden else 0,
                             qkv_bias=qkv_bias, attn_out_bias=attn_out_bias, qk_norm=model_type in QK_NORM_TYPES,
                             norm_eps=_norm_eps(cfg),
                             **_rotary(cfg, path))
    except KeyError as exc:
        raise PlanError(f"model config '{path}' lacks the key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise PlanError(f"model config '{path}' has a value of the wrong type ({exc})") from None
    except ZeroDivisionError:
        raise PlanError(f"model config '{path}' gives 0 attention heads") from None
    validate_model(spec)
    return spec


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
    """A model small enough for CPU tests of every parallel layout (divisible by 2 and 4 everywhere)."""
    base = dict(name=f"tiny-{family}", family=family, num_layers=4, hidden=64, num_heads=4, num_kv_heads=4,
                ffn_hidden=128, vocab_size=256, max_seq_len=64, default_seq_len=32, default_global_batch=8,
                tie_embeddings=family != "llama", norm_eps=BERT_NORM_EPS if family == "bert" else 1e-5)
    if family == "llama":
        base["num_kv_heads"] = 2
    base.update(over)
    spec = ModelSpec(**base)
    validate_model(spec)
    return spec
