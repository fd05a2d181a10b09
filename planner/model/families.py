"""Model families: each family's layer parts stated once, as named traits, and the registry every consumer reads.

A ModelSpec names its family (`ModelSpec.family`, a string, so plan files and the catalogue stay plain data); the
planner's counts, memory and cost models, the runtime's model builder and data, the profiler's shapes and the
exports read the family's traits (`ModelSpec.model_family`), never its name. Adding a family is one
`register_family(ModelFamily(...))` with a combination of the traits below; `validate_family` refuses a combination
the runtime does not build or the planner does not price.

The traits and what reads them:
  norm              'layernorm' (weight and bias, keeps mean and rstd) or 'rmsnorm' (weight, keeps rstd): the norms'
                    parameters, kernels, saved statistics (planner/memory/, planner/cost/layer.py, runtime/model.py)
                    and Megatron-LM's --normalization.
  post_norm         True: each sub-block's norm comes after its residual add (BERT, x = LN(x + f(x))); False:
                    pre-norm, each sub-block normalises its input and the residual stream runs past it.
  mlp               'gelu' (fc1, GELU, fc2: two matrices), 'swiglu' (gate and up, SiLU(gate) x up, down: three) or
                    'geglu' (gate and up, GELU(gate) x up, down: three, the shapes and costs of SwiGLU; Gemma). The
                    GELU's form (tanh approximation or exact erf) is the model's: ModelSpec.gelu_approximate.
  linear_bias       biases on the q/k/v, output, fc1 and fc2 projections (and on GELU experts' matrices).
  positions         'learned' (a [max_seq_len, hidden] table added to the embedding) or 'rotary' (q and k rotated
                    in every layer's attention; ModelSpec.rope_theta and its scaling apply).
  objective         'causal_lm' (next-token prediction, causal attention) or 'masked_lm' (15% of positions masked
                    and predicted, bidirectional attention; runtime/data.py).
  token_types       a [2, hidden] token-type embedding added to the input (segments A and B).
  embedding_norm    a norm after the input embedding (before the first layer).
  head_transform    the head runs dense [hidden, hidden] + bias, GELU and a norm before the output layer, which
                    takes a bias of its own (BERT's masked-LM head); otherwise the head is the final norm alone.
  norm_unit_offset  every RMSNorm scales by (1 + weight), its weight stored as the offset from one and initialised to
                    zeros, the product taken in fp32 before the cast back (Gemma's GemmaRMSNorm); the norms' shapes,
                    memory and cost are RMSNorm's (runtime/norm.py).
  embedding_scale   the input embedding's output is multiplied by sqrt(hidden), the factor rounded to the compute
                    dtype (Gemma); the output layer (tied or not) reads the unscaled weight. No parameter, no memory.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import PlanError

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "geglu")
POSITIONS = ("learned", "rotary")
OBJECTIVES = ("causal_lm", "masked_lm")


@dataclass(frozen=True)
class ModelFamily:
    """One family's layer parts (see the module docstring for each trait and what reads it).

    Args:
        name: the value of ModelSpec.family that selects this entry.
        default_norm_eps: the norms' epsilon where a spec or a config does not say one (ModelSpec.from_dict of a
            spec without norm_eps, tiny_model).
        default_tie_embeddings: whether tiny_model ties the output layer to the embedding.
        tiny_kv_heads: key/value heads of the family's tiny test model (tiny_model, 4 query heads).
        host_figures_of: the family whose measured host (kernel-issue) times price this one's layers and ends
            (Profile.host is keyed by family name: planner/profile/records.py); '' for the families the host probe
            measures themselves (runtime/profiler/host.py). A new family names the measured one it resembles most.
        summary: a few words for listings and docstrings.
    """
    name: str
    norm: str
    post_norm: bool
    mlp: str
    linear_bias: bool
    positions: str
    objective: str
    token_types: bool = False
    embedding_norm: bool = False
    head_transform: bool = False
    norm_unit_offset: bool = False
    embedding_scale: bool = False
    default_norm_eps: float = 1e-5
    default_tie_embeddings: bool = True
    tiny_kv_heads: int = 4
    host_figures_of: str = ""
    summary: str = ""

    @property
    def causal(self) -> bool:
        """Causal (decoder) attention; a masked-LM encoder attends both ways."""
        return self.objective == "causal_lm"

    @property
    def masked_lm(self) -> bool:
        return self.objective == "masked_lm"

    @property
    def gated_mlp(self) -> bool:
        """A gated MLP (gate and up projections, three matrices): SwiGLU or GeGLU."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def uses_gelu(self) -> bool:
        """Whether a GELU runs anywhere in the layer or the head (ModelSpec.gelu_approximate has a meaning)."""
        return self.mlp in ("gelu", "geglu") or self.head_transform

    @property
    def learned_positions(self) -> bool:
        return self.positions == "learned"

    @property
    def layernorm(self) -> bool:
        return self.norm == "layernorm"

    @property
    def allows_qk_norm(self) -> bool:
        """Whether ModelSpec.qk_norm (Qwen3's per-head q/k RMSNorm, applied before rotary) is modelled: RMSNorm
        families with rotary positions (Llama-style), as Megatron-LM's --qk-layernorm follows --normalization; not
        with (1 + weight) norms (Gemma 3's q/k norms are not built)."""
        return self.norm == "rmsnorm" and self.positions == "rotary" and not self.norm_unit_offset

    @property
    def host_key(self) -> str:
        """The family name Profile.host's per-family figures are read under (host_figures_of, else its own)."""
        return self.host_figures_of or self.name

    @property
    def measured_by_host_probe(self) -> bool:
        """Whether runtime/profiler/host.py measures this family's host times itself."""
        return not self.host_figures_of


FAMILIES: dict[str, ModelFamily] = {}
"""The registered families by name (register_family adds to it; family_of reads it)."""


def _choice(fam: ModelFamily, trait: str, allowed: tuple[str, ...]) -> None:
    value = getattr(fam, trait)
    if value not in allowed:
        raise PlanError(f"model family '{fam.name}': {trait} '{value}' is not one of {', '.join(allowed)}")


def validate_family(fam: ModelFamily) -> None:
    """Refuse, in one sentence, a family the runtime does not build or the planner does not price."""
    if not isinstance(fam.name, str) or not fam.name.isidentifier():
        raise PlanError(f"model family name {fam.name!r} must be a plain identifier")
    for trait, allowed in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS), ("objective", OBJECTIVES)):
        _choice(fam, trait, allowed)
    for trait in ("post_norm", "linear_bias", "token_types", "embedding_norm", "head_transform",
                  "norm_unit_offset", "embedding_scale", "default_tie_embeddings"):
        if not isinstance(getattr(fam, trait), bool):
            raise PlanError(f"model family '{fam.name}': {trait} must be true or false, got {getattr(fam, trait)!r}")
    if fam.gated_mlp and fam.linear_bias:
        # the counts, memory and runtime give a SwiGLU MLP no biases (Llama-style: none anywhere)
        raise PlanError(f"model family '{fam.name}': biases on a gated (SwiGLU / GeGLU) MLP are not modelled")
    if fam.norm_unit_offset and fam.norm != "rmsnorm":
        raise PlanError(f"model family '{fam.name}': norm_unit_offset ((1 + weight) scaling) is modelled for RMSNorm "
                        "only")
    if isinstance(fam.default_norm_eps, bool) or not isinstance(fam.default_norm_eps, (int, float)) \
            or not fam.default_norm_eps > 0:
        raise PlanError(f"model family '{fam.name}': default_norm_eps must be a positive number, "
                        f"got {fam.default_norm_eps!r}")
    if isinstance(fam.tiny_kv_heads, bool) or fam.tiny_kv_heads not in (1, 2, 4):
        raise PlanError(f"model family '{fam.name}': tiny_kv_heads must divide the tiny model's 4 heads, "
                        f"got {fam.tiny_kv_heads!r}")
    if fam.host_figures_of:
        base = FAMILIES.get(fam.host_figures_of)
        if base is None or not base.measured_by_host_probe:
            measured = ", ".join(f.name for f in FAMILIES.values() if f.measured_by_host_probe)
            raise PlanError(f"model family '{fam.name}': host_figures_of '{fam.host_figures_of}' is not a family "
                            f"the host probe measures ({measured})")


def register_family(fam: ModelFamily) -> ModelFamily:
    """Add `fam` to FAMILIES after validate_family; registering an equal entry again is a no-op, another entry
    under a registered name is refused. Returns `fam`."""
    validate_family(fam)
    known = FAMILIES.get(fam.name)
    if known is not None and known != fam:
        raise PlanError(f"model family '{fam.name}' is already registered with other traits")
    FAMILIES[fam.name] = fam
    return fam


def family_of(name_or_spec) -> ModelFamily:
    """The registered family of a family name or of anything with a `family` name (a ModelSpec); PlanError in one
    sentence for a name not registered."""
    name = name_or_spec if isinstance(name_or_spec, str) else getattr(name_or_spec, "family", name_or_spec)
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise PlanError(f"model family '{name}' is not one of {', '.join(FAMILIES)}") from None


GPT = register_family(ModelFamily(
    name="gpt", norm="layernorm", post_norm=False, mlp="gelu", linear_bias=True, positions="learned",
    objective="causal_lm", summary="decoder: LayerNorm, GELU MLP, learned positions, biases (GPT-2/3)"))

LLAMA = register_family(ModelFamily(
    name="llama", norm="rmsnorm", post_norm=False, mlp="swiglu", linear_bias=False, positions="rotary",
    objective="causal_lm", default_tie_embeddings=False, tiny_kv_heads=2,
    summary="decoder: RMSNorm, SwiGLU MLP, rotary positions, no biases (Llama, Mistral, Qwen)"))

BERT_NORM_EPS = 1e-12
"""BERT's LayerNorm epsilon (Devlin et al.'s release; Hugging Face BertConfig.layer_norm_eps)."""

BERT = register_family(ModelFamily(
    name="bert", norm="layernorm", post_norm=True, mlp="gelu", linear_bias=True, positions="learned",
    objective="masked_lm", token_types=True, embedding_norm=True, head_transform=True,
    default_norm_eps=BERT_NORM_EPS,
    summary="encoder: post-norm LayerNorm, GELU MLP, learned positions, token types, masked-LM head"))

GEMMA = register_family(ModelFamily(
    name="gemma", norm="rmsnorm", post_norm=False, mlp="geglu", linear_bias=False, positions="rotary",
    objective="causal_lm", norm_unit_offset=True, embedding_scale=True, default_norm_eps=1e-6,
    tiny_kv_heads=1, host_figures_of="llama",
    summary="decoder: RMSNorm scaled by (1 + weight), GeGLU MLP, rotary, sqrt(hidden)-scaled embedding, tied (Gemma)"))
