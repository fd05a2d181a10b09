"""The grids the profiler measures, derived from the models' real shapes (not a blind cube).

GEMMs: for every catalogue model and every tensor-parallel degree it allows (1, 2, 4, 8), the layer's
linear layers as the runtime shards them (column-parallel QKV and fc1 / gate-up split over TP, row-parallel
out-projection and fc2, vocabulary-parallel output layer, the MoE router, BERT's MLM transform), each as
three GEMMs as runtime/parallel/tensor.py runs them: forward Y[m,n] = X[m,k] W^T (F.linear, W stored
[n,k]), dgrad dX = dY W (m, n=k_in, k=n_out) and wgrad dW = dY^T X (m=n_out, n=k_in, k=tokens).
Tokens m = micro-batch x sequence / CP over micro-batch 1-16, sequence 1k-128k,
CP 1-8 are powers of two; MoE experts see tokens x top_k rows (the routed copies, run as one grouped GEMM
over all local experts and priced as a GEMM of that many rows). Shapes are deduplicated, those above
a FLOP cap left out (their achieved rate equals that of the largest measured shapes beside them), and the
list is ordered so that a time budget cuts the least used shapes: the token counts most plans use
(1k-16k) first, then coarse-to-fine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.model import CATALOGUE, ModelSpec, tiny_model

TP_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    kind: str
    """'fwd' (F.linear(x, w)), 'dgrad' (dy @ w) or 'wgrad' (dy.T @ x, tokens the reduction): the runtime's layouts;
    'fp8fwd' / 'fp8dgrad': the same through runtime/parallel/fp8.py (scaling of both operands included)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def table(self) -> str:
        """The profile table its time goes into (Profile.gemm_table_s): 'fp8', 'wgrad' or 'mm'."""
        return "fp8" if self.kind.startswith("fp8") else "wgrad" if self.kind == "wgrad" else "mm"

    @property
    def key(self) -> tuple[int, int, int, bool]:
        """Shape and whether it is a weight-gradient GEMM (fp32 accumulation: timed and tabled apart)."""
        return (self.m, self.n, self.k, self.kind == "wgrad")


def linear_layers(spec: ModelSpec, tp: int) -> list[tuple[str, int, int]]:
    """(name, out_features per rank, in_features per rank) of the model's linear layers at TP `tp`."""
    h = spec.hidden
    q = spec.num_heads // tp * spec.head_dim
    kv = max(spec.num_kv_heads // tp, 1) * spec.head_dim
    f = spec.ffn_hidden // tp
    vocab = spec.padded_vocab // tp   # the output layer's rows on a rank (ModelSpec.padded_vocab)
    layers = [("qkv", q + 2 * kv, h), ("out_proj", h, q), ("fc2", h, f), ("output", vocab, h)]
    if spec.gated_mlp:
        layers += [("gate_up", 2 * f, h), ("gate_or_up", f, h)]
    else:
        layers += [("fc1", f, h)]
    if spec.is_moe:
        layers += [("router", spec.num_experts, h)]
    if spec.shared_expert_ffn:  # whole on every TP rank, like the routed experts
        layers += [("shared_gate_up", 2 * spec.shared_expert_ffn, h), ("shared_down", h, spec.shared_expert_ffn)]
    if spec.model_family.head_transform:  # BERT's masked-LM head: dense h -> h before the output layer
        layers += [("mlm_dense", h, h)]
    return layers


def allowed_tp(spec: ModelSpec, degrees=TP_DEGREES) -> list[int]:
    return [t for t in degrees if spec.num_heads % t == 0 and spec.ffn_hidden % t == 0 and spec.hidden % t == 0]


def pow2_range(lo: int, hi: int, step: int = 1) -> list[int]:
    out, e = [], int(math.log2(lo))
    while 2 ** e <= hi:
        out.append(2 ** e)
        e += step
    return out


@dataclass(frozen=True)
class GridSpec:
    models: tuple
    tokens: tuple
    """Token counts m for dense layers: powers of two, and in the full GPU grid also 3 x 2^e (micro-batches
    of 3, 6, 12 ... are divisors of common global batches such as 1536, so the planner asks for them)."""
    flops_cap: float
    max_shapes: int
    tp_degrees: tuple = TP_DEGREES


def gpu_grid_spec(quick: bool) -> GridSpec:
    models = tuple(CATALOGUE.values())
    if quick:
        return GridSpec(models=models, tokens=tuple(pow2_range(256, 65536, 2)), flops_cap=4e12, max_shapes=500,
                        tp_degrees=(1, 2, 8))
    threes = [3 * t for t in pow2_range(64, 65536)]  # 192 ... 196608 / 2: between the powers of two
    return GridSpec(models=models, tokens=tuple(sorted(pow2_range(128, 131072) + threes)), flops_cap=1.5e13,
                    max_shapes=9500)


def cpu_grid_spec(quick: bool) -> GridSpec:
    models = (tiny_model("gpt"), tiny_model("llama"), tiny_model("bert"),
              tiny_model("llama", name="tiny-moe", num_experts=4, top_k=2))
    toks = pow2_range(8, 512, 2 if quick else 1)
    return GridSpec(models=models, tokens=tuple(toks), flops_cap=2e8, max_shapes=150 if quick else 400,
                    tp_degrees=(1, 2, 4))


def gemm_grid(spec: GridSpec) -> list[GemmShape]:
    """The deduplicated GEMM shapes, ordered coarse (m a power of 4) to fine, capped in count."""
    shapes: dict[tuple, GemmShape] = {}

    def add(m, n, k, kind):
        if min(m, n, k) < 1:
            return
        s = GemmShape(m, n, k, kind)
        if s.flops <= spec.flops_cap and s.key not in shapes:
            shapes[s.key] = s

    for model in spec.models:
        for tp in allowed_tp(model, spec.tp_degrees):
            for name, n_out, k_in in linear_layers(model, tp):
                for tokens in spec.tokens:
                    m = tokens
                    if model.is_moe and name in ("gate_up", "gate_or_up", "fc2"):
                        m = tokens * model.top_k
                    add(m, n_out, k_in, "fwd")
                    add(m, k_in, n_out, "dgrad")
                    add(n_out, k_in, m, "wgrad")
    ordered = sorted(shapes.values(), key=_coarse_first)
    return ordered[:spec.max_shapes]


def model_gemm_shapes(spec: ModelSpec, seq_len: int, tp_degrees=TP_DEGREES, cp_degrees=(1, 2, 4, 8),
                      max_micro_batch: int = 16, flops_cap: float = float("inf")) -> list[GemmShape]:
    """Every GEMM one model's plans can run (`plan profile --model`): its linear layers at each TP degree it
    allows, at every token count micro-batch x sequence / CP for micro-batches 1-max_micro_batch and the CP
    degrees whose ring splits the sequence, each as forward, dgrad and wgrad. Measured before the catalogue
    grid, so that a model's plans read measured times, not interpolated ones: between the grid's lines cuBLAS
    runs some shapes 9-17% off the interpolated rate, repeatably (benchmarks/results/README.md).
    Ordered small first; deduplicated."""
    toks = sorted({mb * seq_len // cp for mb in range(1, max_micro_batch + 1) for cp in cp_degrees
                   if seq_len % (2 * cp) == 0 or cp == 1})
    out: dict[tuple, GemmShape] = {}
    for tp in allowed_tp(spec, tp_degrees):
        for name, n_out, k_in in linear_layers(spec, tp):
            for t in toks:
                m = t * spec.top_k if spec.is_moe and name in ("gate_up", "gate_or_up", "fc2") else t
                for g in (GemmShape(m, n_out, k_in, "fwd"), GemmShape(m, k_in, n_out, "dgrad"),
                          GemmShape(n_out, k_in, m, "wgrad")):
                    if min(g.m, g.n, g.k) >= 1 and g.flops <= flops_cap:
                        out.setdefault(g.key, g)
    return sorted(out.values(), key=lambda g: (g.flops, g.key))


FP8_LAYERS = ("qkv", "out_proj", "fc1", "gate_up", "fc2")
"""The linears runtime/parallel/fp8.py runs in FP8 (the dense transformer layers'; not the output layer, the
router, BERT's head transform, or MoE experts, whose grouped GEMMs stay bf16)."""


def fp8_gemm_grid(spec: GridSpec, tokens: list[int] | None = None) -> list[GemmShape]:
    """FP8 forward ('fp8fwd') and input-gradient ('fp8dgrad') shapes of the dense layers, small first, at
    `tokens` or else at the grid's common token counts (powers of two from COMMON_TOKENS[0] to [1])."""
    from runtime.parallel.fp8 import fits as fp8_fits

    shapes: dict[tuple, GemmShape] = {}
    if tokens is None:
        tokens = [t for t in spec.tokens if COMMON_TOKENS[0] <= t <= COMMON_TOKENS[1] and t & (t - 1) == 0] \
            or [t for t in spec.tokens if t & (t - 1) == 0]
    for model in spec.models:
        if model.is_moe:
            gemm_layers = ("qkv", "out_proj")  # the experts' GEMMs stay bf16
        else:
            gemm_layers = FP8_LAYERS
        for tp in allowed_tp(model, spec.tp_degrees):
            for name, n_out, k_in in linear_layers(model, tp):
                if name not in gemm_layers:
                    continue
                for m in tokens:
                    for s in (GemmShape(m, n_out, k_in, "fp8fwd"), GemmShape(m, k_in, n_out, "fp8dgrad")):
                        if s.flops <= spec.flops_cap and fp8_fits(s.m, s.n, s.k):
                            shapes.setdefault((s.m, s.n, s.k), s)
    return sorted(shapes.values(), key=lambda s: (s.flops, s.key))


COMMON_TOKENS = (1024, 16384)
"""Token counts per GEMM that most plans use (micro-batch x sequence / CP): measured first."""


def token_count(s: GemmShape) -> int:
    """The token axis of a GEMM: m, or k for a weight gradient (tokens are its reduction)."""
    return s.k if s.kind == "wgrad" else s.m


def on_power_of_two(s: GemmShape) -> bool:
    t = token_count(s)
    return t & (t - 1) == 0


def _coarse_first(s: GemmShape):
    # every power-of-two token count before any 3 x 2^e one (a budget that runs out then thins the grid
    # between its lines, not the lines); among them the common token counts first (a time budget that cuts the
    # grid part-way must not leave a common count such as m = 8192, gpt-1.3b at micro-batch 4, unmeasured, where
    # its interpolation would decide plans); then level 0: the token axis a power of 4,
    # level 1: the rest; within those, small first
    tok = token_count(s)
    between = not on_power_of_two(s)
    level = 0 if int(math.log2(tok)) % 2 == 0 else 1
    common = 0 if COMMON_TOKENS[0] <= tok <= COMMON_TOKENS[1] else 1
    return (between, common, level, s.flops, s.key)


def attention_grid(device_type: str, quick: bool, head_dims: list[int] | None = None,
                   max_seq: int | None = None, causal: tuple[bool, ...] = (True, False)) -> list[dict]:
    """(batch, heads, seq, head_dim, causal) points; batch x heads chosen so each point is a bounded amount
    of work while still filling the GPU (at least a few thousand query tiles). head_dims / max_seq / causal
    narrow it to one model's attention (`plan profile --model M --base P`, runtime/profiler/extend.py)."""
    if device_type != "cuda":
        seqs = [16, 64, 256] if quick else [16, 32, 64, 128, 256]
        dims = head_dims or [16, 32]
        return [dict(batch=2, heads=4, seq=s, head_dim=d, causal=c) for s in seqs for d in dims for c in causal
                if max_seq is None or s <= max(max_seq, seqs[0])]
    seqs = pow2_range(512, 32768, 2) if quick else pow2_range(512, 131072)
    if max_seq is not None:  # the smallest grid length at or above max_seq covers it
        seqs = [s for s in seqs if s < max_seq] + [s for s in seqs if s >= max_seq][:1]
    dims = head_dims or ([128] if quick else [64, 128])
    pts = []
    for s in seqs:
        tokens = 16384 if s <= 16384 else s
        batch = max(1, tokens // s)
        heads = 16 if s <= 32768 else max(4, 16 * 32768 // s)
        for d in dims:
            for c in causal:
                pts.append(dict(batch=batch, heads=heads, seq=s, head_dim=d, causal=c))
    return pts
