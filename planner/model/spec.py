"""ModelSpec: one model's shape, with its exact parameter, activation and FLOP counts, and its validation."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from planner.errors import PlanError
from planner.model.families import FAMILIES, ModelFamily, family_of
from planner.model.families import BERT_NORM_EPS  # noqa: F401  (re-exported: planner.model's public name)

GELU_FORMS = ("tanh", "none")
"""ModelSpec.gelu_approximate's values: torch's F.gelu approximate= argument (tanh approximation, exact erf)."""

VOCAB_PAD_MULTIPLE = 128
"""The embedding and output layer's rows are the vocabulary padded to a multiple of this (ModelSpec.padded_vocab)."""

@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    """The name of a registered ModelFamily (planner/model/families.py), whose traits say the layer's parts: 'gpt'
    (decoder, LayerNorm, GELU, learned positions), 'llama' (decoder, RMSNorm, SwiGLU, rotary), 'gemma' (Llama's layer
    with GeGLU, (1 + weight) norms and a scaled embedding) or 'bert' (encoder: bidirectional attention, token types,
    masked-LM head)."""
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads; equal to num_heads for multi-head attention, fewer for GQA."""
    ffn_hidden: int
    """Inner width of the MLP (of each expert for MoE)."""
    vocab_size: int
    """Token ids the tokenizer produces (0..vocab_size-1). The embedding and output layer allocate
    `padded_vocab` rows."""
    max_seq_len: int
    """Longest sequence the model supports (the size of the learned position table where the family has one)."""
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
    """Biases on the q, k and v projections of a model whose family has no linear biases (Qwen2 and Qwen2-MoE always
    have them; Llama-family configs with attention_bias true). A family with linear biases has them whatever this
    says (has_bias)."""
    attn_out_bias: bool = False
    """A bias on the attention's output projection of a model whose family has no linear biases (Llama-family
    attention_bias true, with qkv_bias). A family with linear biases has it whatever this says (has_bias)."""
    qk_norm: bool = False
    """Qwen3's q/k norms (Llama-style families only: ModelFamily.allows_qk_norm): after the q/k projections and before rotary, each head of q and
    of k is RMS-normalised over head_dim (epsilon norm_eps) and scaled by a [head_dim] weight shared across the heads,
    one for q (q_norm) and one for k (k_norm) per layer (Hugging Face qwen3 and qwen3_moe, Megatron --qk-layernorm).
    OLMo2's norms over the whole q and k projections are another thing, not this."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies: pair i of a head turns by position x rope_theta^(-2i / head_dim) (Hugging Face
    rope_theta, Megatron --rotary-base; Llama 3 500000, Mixtral and Qwen2 1e6). Meaningless for learned positions."""
    norm_eps: float = 1e-5
    """Epsilon of every LayerNorm / RMSNorm (Hugging Face rms_norm_eps / layer_norm_eps, Megatron --norm-epsilon;
    BERT 1e-12 (BERT_NORM_EPS, the bert family's default_norm_eps), Qwen2 1e-6)."""
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
    gelu_approximate: str = "tanh"
    """The form of every GELU the model runs (its GELU MLP's, GeGLU's gate, BERT's head transform), as torch's
    F.gelu(approximate=...) names it: 'tanh' (GELU's tanh approximation: Hugging Face gelu_new / gelu_pytorch_tanh,
    GPT-2's and Gemma's) or 'none' (the exact erf form: Hugging Face "gelu", BERT's). Only a family that runs a GELU
    (ModelFamily.uses_gelu) takes 'none'. The fused bias-GELU kernel computes the tanh form (fused_bias_gelu)."""
    hf_model_type: str = ""
    """The Hugging Face model_type of the config.json the spec was read from (llama, gemma, bert, phi, ...); '' for
    the catalogue's and hand-written specs. `plan launch` refuses to train a type the runtime only approximates
    (runtime/hf/checks.py APPROXIMATED_TYPES), and a checkpoint folder of another type does not load."""

    # -- derived structure -------------------------------------------------
    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and the output layer: the vocabulary padded to a multiple of VOCAB_PAD_MULTIPLE, as
        Megatron-LM pads it, so the output GEMMs and the logits run at aligned shapes (GPT-2's 50,257 ran its three
        output GEMMs in cuBLAS's alignment-1 kernels, about 5x slower than at 50,304, and a GPT-2-large step 14-24% over
        its prediction). A fixed multiple (not 128 x TP) keeps checkpoints the same under
        every plan, and divides by every TP degree. Padded ids are never targets; their logits are masked out of
        the softmax (runtime/parallel/cross_entropy.py, mask_padded_vocab), so the loss is the real vocabulary's."""
        return -(-self.vocab_size // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def model_family(self) -> ModelFamily:
        """The registered family named by `family` (planner/model/families.py): the layer's parts."""
        fam = FAMILIES.get(self.family)
        return fam if fam is not None else family_of(self.family)

    @property
    def causal(self) -> bool:
        """Causal (decoder) attention; the family's objective says it."""
        return self.model_family.causal

    @property
    def gated_mlp(self) -> bool:
        """A gated MLP (gate and up projections: SwiGLU, or Gemma's GeGLU) rather than a plain GELU MLP."""
        return self.model_family.gated_mlp

    @property
    def fused_bias_gelu(self) -> bool:
        """The dense MLP's fc1 bias is added inside the activation's kernel (runtime/bias_gelu.py, tanh GELU): a
        plain GELU MLP with biases, not MoE, in GELU's tanh form. The exact (erf) form adds the bias in the GEMM and
        runs torch's GELU."""
        return not self.gated_mlp and self.has_bias and not self.is_moe and self.gelu_approximate == "tanh"

    @property
    def has_bias(self) -> bool:
        """Biases on the linear layers (q/k/v, output projection, fc1, fc2): GPT-2/3 and BERT have them, Llama-style
        models do not."""
        return self.model_family.linear_bias

    @property
    def layernorm(self) -> bool:
        """LayerNorm (weight and bias) rather than RMSNorm (weight only) in every norm."""
        return self.model_family.layernorm

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
        """A learned position table rather than rotary positions."""
        return self.model_family.learned_positions

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_heads_local(self, tp: int) -> int:
        """KV heads one TP rank computes: kv_heads / tp, or one (shared with the ranks of its query group) where
        TP exceeds the KV heads (runtime/parallel/tensor.py, SharedKVQKVLinear; Megatron-Core likewise)."""
        return max(self.num_kv_heads // tp, 1)

    def qkv_width_local(self, tp: int) -> int:
        """Output width of one TP rank's fused qkv GEMM: its q heads and its KV heads' K and V."""
        return self.q_width // tp + 2 * self.kv_heads_local(tp) * self.head_dim

    def qkv_weight_rows_local(self, tp: int) -> float:
        """Rows of the qkv weight one TP rank holds: (q + 2 kv) / tp, or, where TP exceeds the KV heads, its q
        rows and every KV head's K and V rows, whole on every rank (SharedKVQKVLinear)."""
        if self.num_kv_heads >= tp:
            return (self.q_width + 2 * self.kv_width) / tp
        return self.q_width / tp + 2 * self.kv_width

    # -- parameter counts (elements) ---------------------------------------
    def norm_params(self) -> int:
        return 2 * self.hidden if self.layernorm else self.hidden

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
        """Input side: token embedding, learned positions, token types and embedding norm (as the family has them)."""
        fam = self.model_family
        n = self.padded_vocab * self.hidden
        if self.learned_positions:
            n += self.max_seq_len * self.hidden
        if fam.token_types:
            n += 2 * self.hidden
        if fam.embedding_norm:
            n += self.norm_params()
        return n

    def head_params(self) -> int:
        """Output side: the head's norm (the final norm, or the transform's), the output projection unless tied, and
        with a head transform (BERT's masked-LM head) its dense h->h and bias and the output layer's bias."""
        h = self.hidden
        n = self.norm_params() + (0 if self.tie_embeddings else self.padded_vocab * h)
        if self.model_family.head_transform:
            n += h * h + h + self.padded_vocab
        return n

    def vocab_padding_params(self) -> int:
        """Parameters of the padded vocabulary rows (ModelSpec.padded_vocab): allocated and counted in memory, never
        trained towards; published counts leave them out."""
        rows = self.padded_vocab - self.vocab_size
        n = rows * self.hidden * (1 if self.tie_embeddings else 2)
        return n + (rows if self.model_family.head_transform else 0)  # the output layer's bias

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
        f = 2 * h * self.padded_vocab
        if self.model_family.head_transform:
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
        if "norm_eps" not in d and isinstance(d.get("family"), str) and d["family"] in FAMILIES:
            # a spec without norm_eps has its family's default epsilon (BERT's 1e-12)
            d = dict(d, norm_eps=FAMILIES[d["family"]].default_norm_eps)
        try:
            spec = ModelSpec(**d)
        except TypeError as exc:
            raise PlanError(f"model spec is incomplete: {exc}") from None
        validate_model(spec)
        return spec


def validate_model(m: ModelSpec) -> None:
    """Reject specs no runtime could build, with one sentence naming the field."""
    fam = family_of(m.family)
    for name in ("num_layers", "hidden", "num_heads", "num_kv_heads", "ffn_hidden", "vocab_size",
                 "max_seq_len", "default_seq_len", "default_global_batch", "num_experts", "top_k"):
        v = getattr(m, name)
        if not isinstance(v, int) or v < 1:
            raise PlanError(f"model '{m.name}': {name} must be a positive integer, got {v!r}")
    if m.head_dim_override == 0 and m.hidden % m.num_heads:
        raise PlanError(f"model '{m.name}': hidden {m.hidden} is not divisible by {m.num_heads} heads")
    if m.num_heads % m.num_kv_heads:
        raise PlanError(f"model '{m.name}': {m.num_heads} heads are not divisible by {m.num_kv_heads} KV heads")
    if not m.learned_positions and m.head_dim % 2:
        # runtime/attention.py and runtime/rotary.py rotate each head's two halves against each other
        raise PlanError(f"model '{m.name}': rotary positions need an even head dimension, got {m.head_dim}")
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
    if m.qk_norm and not fam.allows_qk_norm:
        raise PlanError(f"model '{m.name}': qk_norm (per-head q/k RMSNorm before rotary) is modelled for Llama-style "
                        f"models only, not for family '{m.family}'")
    if m.gelu_approximate not in GELU_FORMS:
        raise PlanError(f"model '{m.name}': gelu_approximate must be one of {', '.join(GELU_FORMS)}, "
                        f"got {m.gelu_approximate!r}")
    if m.gelu_approximate != "tanh" and not fam.uses_gelu:
        raise PlanError(f"model '{m.name}': gelu_approximate '{m.gelu_approximate}' is set but family '{m.family}' "
                        "runs no GELU")
    if m.is_moe and fam.mlp == "geglu":
        raise PlanError(f"model '{m.name}': GeGLU experts are not modelled (the runtime's gated experts are SwiGLU)")
    if not isinstance(m.hf_model_type, str):
        raise PlanError(f"model '{m.name}': hf_model_type must be a string, got {m.hf_model_type!r}")
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
