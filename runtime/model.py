"""GPT, Llama-style, Gemma and BERT models (any registered family) from a planner ModelSpec, built from the
tensor-parallel layers as the family's traits say (planner/model/families.py: norm kind and its (1 + weight) offset,
pre- or post-norm, MLP kind, biases, positions, token types, embedding norm and scale, head transform) and in the
GELU form the spec names (ModelSpec.gelu_approximate).

A model is a sequence of pieces so that a pipeline stage is simply (optional embedding, a contiguous
range of layers, optional head):  `build_stage(spec, groups, start, end, has_embedding, has_head, modes)`.
The residual stream is [seq, batch, hidden] (sequence first, so the sequence-parallel collectives move
contiguous memory), sharded over the sequence when TP > 1.

Activations each layer keeps for backward, per token, with TP t (sequence parallel), in the compute
dtype (bf16 on GPU). "h/t" = sequence-sharded, "x/t" otherwise = head/feature-sharded over the full sequence:
  recompute 'none':
    attention norm input h/t          (the residual; LayerNorm/RMSNorm also keep fp32 mean/rstd: 1-2 floats/t)
    qkv GEMM input (norm output) h/t  (sequence-sharded; re-gathered in backward)
    q, k, v after rotary (q_width + 2 kv_width)/t   (SDPA's saved inputs)
    with Qwen3's q/k norms (spec.qk_norm): the qkv GEMM output (q_width + 2 kv_width)/t, which their saved inputs
                                      are views of, and an fp32 rstd per head, (heads + kv_heads)/t floats (F.rms_norm's
                                      CPU composite also keeps the normalised q and k)
    attention output (proj GEMM input) q_width/t    (+ fp32 log-sum-exp heads/t on GPU flash/efficient;
                                                     the CPU math kernel keeps the [s, s] probabilities)
    MLP norm input h/t, fc1 GEMM input (norm output) h/t
    activation input f/t (SwiGLU: gate and up, 2f/t), activation output (fc2 GEMM input) f/t
    nothing else: residual adds, biases, rotary (cos/sin are shared tables) and the row-parallel outputs
    keep nothing; there is no dropout.
  recompute 'selective': as 'none' without the two norm outputs (recomputed from the norm inputs inside
    the column-parallel backward), without the activation output (recomputed from its input inside the
    row-parallel backward), and the attention core (q/k norms + rotary + SDPA) is checkpointed: its input, the qkv
    GEMM output (q_width + 2 kv_width)/t, is kept instead of q, k, v, the log-sum-exp and the q/k norms' tensors.
    A post-norm family (BERT): its norm outputs are the residual stream itself, so there is nothing to drop there.
  recompute 'full': only the layer input h/t (torch.utils.checkpoint of the whole layer).
Head stage: the final norm input h/t, its output h/t (sequence-sharded), and the fp32 softmax of the
logits over the full sequence, V/t floats per token (vocab-parallel cross-entropy), plus int64 targets.
"""
from __future__ import annotations

import functools
import math
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from planner.model import ModelSpec
from runtime.attention import attention, rotary_tables
from runtime.bias_gelu import bias_gelu
from runtime.geglu import geglu
from runtime.norm import norm_forward, residual_norm
from runtime.qk_norm import fused as qk_norm_fused
from runtime.qk_norm import qk_norm
from runtime.rotary import qkv_rotary
from runtime.parallel.cross_entropy import mask_padded_vocab, vocab_parallel_cross_entropy
from runtime.parallel.tensor import (ColumnParallelLinear, RowParallelLinear, SharedKVQKVLinear, VocabParallelEmbedding,
                                     _tp_param, group_rank, group_size, local_shard)
from runtime.swiglu import swiglu

IGNORE_INDEX = -100


class Norm(nn.Module):
    """LayerNorm with bias (GPT, BERT) or RMSNorm (Llama), as the family's norm trait says; with norm_unit_offset
    (Gemma) the RMSNorm scales by (1 + weight) and its weight starts at zero. Replicated over TP, applied to sequence
    shards. `residual(x, delta)` fuses the residual add before it (runtime/norm.py: one Triton kernel each way on
    CUDA)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.rms = not spec.layernorm
        self.unit_offset = spec.model_family.norm_unit_offset
        self.eps = spec.norm_eps
        self.weight = _tp_param((spec.hidden,), None, init=("zeros",) if self.unit_offset else ("ones",),
                                sequence_parallel=True)
        self.bias = None if self.rms else _tp_param((spec.hidden,), None, init=("zeros",), sequence_parallel=True)
        for p in (self.weight, self.bias):  # runtime/norm.py writes their gradients straight into main_grad
            if p is not None:
                p.wgrad_fusable = True

    def residual(self, x, delta=None):
        """(s, y): the residual stream s = x + delta (x when delta is None) and y = norm(s)."""
        return residual_norm(x, delta, self.weight, self.bias, self.eps, self.rms, self.unit_offset)

    def normalize(self, s):
        """norm(s) without autograd: what selective recompute rebuilds in a GEMM's backward."""
        return norm_forward(s, self.weight, self.bias, self.eps, self.rms, self.unit_offset)

    def forward(self, x):
        return self.residual(x)[1]


@functools.cache
def rounded_to(value: float, dtype: torch.dtype) -> float:
    """value rounded to dtype, as a Python number: x * it is x * torch.tensor(value, dtype=x.dtype) without a host
    to device copy (none may run inside a CUDA-graph capture)."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


class Embedding(nn.Module):
    """Token embedding (vocab-parallel), and as the family has them learned positions (GPT, BERT), token types and an
    embedding norm (BERT), and the sqrt(hidden) scale (Gemma: the factor rounded to the embedding's dtype, as
    transformers' GemmaTextScaledWordEmbedding rounds it)."""

    def __init__(self, spec: ModelSpec, groups):
        super().__init__()
        fam = spec.model_family
        self.spec, self.tp = spec, groups.tp
        self.word = VocabParallelEmbedding(spec.padded_vocab, spec.hidden, groups.tp)
        self.position = _tp_param((spec.max_seq_len, spec.hidden), None, sequence_parallel=True) \
            if spec.learned_positions else None
        self.token_type = _tp_param((2, spec.hidden), None, sequence_parallel=True) if fam.token_types else None
        self.norm = Norm(spec) if fam.embedding_norm else None
        self.scale = math.sqrt(spec.hidden) if fam.embedding_scale else None

    def forward(self, tokens, positions, token_types=None):
        """tokens, token_types [s, b]; positions [s] -> [s/t, b, h]."""
        x = self.word(tokens)
        if self.scale is not None:
            x = x * rounded_to(self.scale, x.dtype)
        t, r = group_size(self.tp), group_rank(self.tp)
        if self.position is not None:
            x = x + self.position[positions.chunk(t)[r]].unsqueeze(1)
        if self.token_type is not None and token_types is not None:
            x = x + self.token_type[token_types.chunk(t)[r]]
        return self.norm(x) if self.norm is not None else x


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, groups, overlap: bool):
        super().__init__()
        t = group_size(groups.tp)
        # a head is never split over TP ranks (planner/legality.py refuses such a layout; a q or KV width that happens
        # to divide by TP would otherwise build a layer of the wrong head count)
        if spec.num_heads % t:
            raise ValueError(f"{spec.num_heads} attention heads are not divisible by TP {t}")
        if spec.num_kv_heads % t and t % spec.num_kv_heads:
            raise ValueError(f"{spec.num_kv_heads} KV heads are neither a multiple nor a divisor of TP {t}")
        self.spec, self.groups = spec, groups
        self.heads, self.kv_heads, self.d = spec.num_heads // t, max(spec.num_kv_heads // t, 1), spec.head_dim
        # the qkv bias (GPT, BERT, Qwen2-style) is split like the weight's rows: each rank its heads' q, k, v parts;
        # with fewer KV heads than TP ranks each rank uses one KV head, shared with the ranks of its q heads' group
        if spec.num_kv_heads < t:
            self.qkv = SharedKVQKVLinear(spec.hidden, spec.q_width, spec.num_kv_heads, spec.head_dim,
                                         spec.has_qkv_bias, groups.tp, overlap)
        else:
            self.qkv = ColumnParallelLinear(spec.hidden, [spec.q_width, spec.kv_width, spec.kv_width],
                                            spec.has_qkv_bias, groups.tp, overlap)
        self.proj = RowParallelLinear(spec.q_width, spec.hidden, spec.has_attn_out_bias, groups.tp,
                                      std=0.02 / math.sqrt(2 * spec.num_layers))
        # Qwen3's q/k norms: [d] weights whole on every TP rank; each rank normalises its own heads, so its gradient
        # is a partial sum, all-reduced over TP like the sequence-parallel norms' (runtime/parallel/data_parallel.py)
        self.q_norm = _tp_param((self.d,), None, init=("ones",), sequence_parallel=True) if spec.qk_norm else None
        self.k_norm = _tp_param((self.d,), None, init=("ones",), sequence_parallel=True) if spec.qk_norm else None

    def qk_normalize(self, qkv):
        """qkv [s, b, (heads + 2 kv_heads) d] with each head of q and of k RMS-normalised over d and scaled by q_norm /
        k_norm (Qwen3), v as it was: a new tensor in qkv's layout, so the fused rotary takes it as before. The norms
        keep their input (a view into qkv, which so stays alive) and an fp32 rstd per head (planner/memory/activations.py)."""
        eps = self.spec.norm_eps
        if qk_norm_fused(qkv):  # one Triton kernel each way in qkv's layout (runtime/qk_norm.py)
            return qk_norm(qkv, self.q_norm, self.k_norm, self.heads, self.kv_heads, eps)
        s, b, _ = qkv.shape
        q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1)
        q = F.rms_norm(q.view(s, b, self.heads, self.d), (self.d,), self.q_norm, eps)
        k = F.rms_norm(k.view(s, b, self.kv_heads, self.d), (self.d,), self.k_norm, eps)
        return torch.cat([q.flatten(2), k.flatten(2), v], dim=-1)

    def core(self, qkv, cos, sin):
        """qkv [s, b, (heads + 2 kv_heads) d] -> attention output [s, b, heads d] (q/k norms + rotary + SDPA)."""
        s, b, _ = qkv.shape
        if self.q_norm is not None:
            qkv = self.qk_normalize(qkv)
        if cos is not None:  # new q, k, v tensors (runtime/rotary.py): the rotary keeps no view of the qkv GEMM output
            q, k, v = qkv_rotary(qkv, cos, sin, self.heads, self.kv_heads)
        else:
            q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1)
            q = q.view(s, b, self.heads, self.d).permute(1, 2, 0, 3)
            k = k.view(s, b, self.kv_heads, self.d).permute(1, 2, 0, 3)
            v = v.view(s, b, self.kv_heads, self.d).permute(1, 2, 0, 3)
        o = attention(q, k, v, self.spec.causal, self.groups)
        return o.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.d)

    def forward(self, x, rope, selective: bool, recompute=None):
        """x: [s/t, b, h], the qkv GEMM input (the norm output for pre-norm models). recompute=(fn, src):
        x == fn(src), keep src instead of x (selective recompute of the norm)."""
        cos, sin = rope if rope is not None else (None, None)
        qkv = self.qkv(x, recompute=recompute if selective else None)
        if selective:
            o = checkpoint(self.core, qkv, cos, sin, use_reentrant=False)
        else:
            o = self.core(qkv, cos, sin)
        return self.proj(o)


class MLP(nn.Module):
    """GELU MLP, SwiGLU or GeGLU (the family's mlp trait; GELU in the spec's gelu_approximate form). Interface shared
    with MoE: forward(x, selective, recompute) -> [s/t, b, h]."""

    def __init__(self, spec: ModelSpec, groups, overlap: bool):
        super().__init__()
        f = spec.ffn_hidden
        self.kind, self.approximate = spec.model_family.mlp, spec.gelu_approximate
        self.fc1 = ColumnParallelLinear(spec.hidden, [f, f] if spec.gated_mlp else [f], spec.has_bias, groups.tp,
                                        overlap)
        self.fc2 = RowParallelLinear(f, spec.hidden, spec.has_bias, groups.tp, std=0.02 / math.sqrt(2 * spec.num_layers))
        # tanh GELU with a bias: fc1's bias is added with the activation, and its gradient comes with GELU's
        # (runtime/bias_gelu.py), not from a separate sum over fc1's output gradient; the exact (erf) GELU keeps the
        # bias in fc1 and runs torch's GELU
        self.bias_act = spec.fused_bias_gelu
        self.fc1.skip_bias_add = self.bias_act

    def act(self, a):
        """The activation of fc1's output a (bias included where fc1 skipped it); also what selective recompute
        reruns, under no_grad."""
        if self.bias_act:
            return bias_gelu(a, self.fc1.bias)
        if self.kind == "swiglu":
            return swiglu(a)
        if self.kind == "geglu":
            return geglu(a, self.approximate)
        return F.gelu(a, approximate=self.approximate)

    def forward(self, x, selective: bool = False, recompute=None):
        """x: the fc1 GEMM input; recompute as for Attention.forward."""
        a = self.fc1(x, recompute=recompute if selective else None)
        y = self.act(a)
        return self.fc2(y, recompute=(self.act, a) if selective else None)


class TransformerLayer(nn.Module):
    def __init__(self, spec: ModelSpec, groups, recompute: str, overlap: bool = True):
        super().__init__()
        assert recompute in ("none", "selective", "full")
        self.recompute, self.post_norm = recompute, spec.model_family.post_norm
        self.attn_norm = Norm(spec)
        self.attn = Attention(spec, groups, overlap)
        self.mlp_norm = Norm(spec)
        if spec.is_moe:
            from runtime.parallel.expert import MoEMLP  # written with expert parallelism
            self.mlp = MoEMLP(spec, groups, capacity_factor=spec.moe_capacity_factor or None,
                              normalize_topk=spec.moe_normalize_topk, aux_coeff=spec.moe_aux_loss_coeff)
        else:
            self.mlp = MLP(spec, groups, overlap)

    def _forward(self, x, rope):
        sel = self.recompute == "selective"
        if self.post_norm:  # x = LN(x + attn(x)); x = LN(x + mlp(x))
            _, x = self.attn_norm.residual(x, self.attn(x, rope, sel))
            return self.mlp_norm.residual(x, self.mlp(x, sel))[1]
        # pre-norm: s is the residual stream; each norm takes the add before it, and in backward the
        # residual's gradient is merged inside the norm's backward (runtime/norm.py)
        s, y = self.attn_norm.residual(x)
        a = self.attn(y, rope, sel, recompute=(self.attn_norm.normalize, s))
        s, y = self.mlp_norm.residual(s, a)
        return s + self.mlp(y, sel, recompute=(self.mlp_norm.normalize, s))

    def forward(self, x, rope=None):
        if self.recompute == "full":
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)


class Head(nn.Module):
    """Final norm + output projection (vocab-parallel, tied or not) + vocab-parallel CE over the labelled positions.
    With a head transform (BERT's masked-LM head): dense + GELU + norm before the output layer, which has its own
    bias."""

    def __init__(self, spec: ModelSpec, groups, overlap: bool, own_tied_copy: bool):
        super().__init__()
        self.spec, self.tp = spec, groups.tp
        t = group_size(groups.tp)
        v = spec.padded_vocab  # ModelSpec.padded_vocab: aligned output GEMMs
        self.transform = spec.model_family.head_transform
        if self.transform:
            self.dense = _tp_param((spec.hidden, spec.hidden), None, sequence_parallel=True)
            self.dense_bias = _tp_param((spec.hidden,), None, init=("zeros",), sequence_parallel=True)
            self.decoder_bias = _tp_param((v // t,), 0, [v], init=("zeros",))
        self.norm = Norm(spec)
        # the output layer; tied models use the embedding's weight (passed in), or a copy on a later
        # pipeline stage (the pipeline all-reduces its gradient with the first stage's).
        self.output = ColumnParallelLinear(spec.hidden, [v], False, groups.tp, overlap)
        if spec.tie_embeddings:
            del self.output.weight
            self.output.weight = None
            if own_tied_copy:
                self.word_weight = _tp_param((v // t, spec.hidden), 0, [v])
                self.word_weight.logical_name = "embedding.word.weight"
                self.word_weight.tied_copy = True

    def forward(self, x, labels, tied_weight=None):
        """x [s/t, b, h], labels [s, b] -> (sum of per-token losses (fp32), number of labelled tokens)."""
        if self.transform:
            x = self.norm(F.gelu(F.linear(x, self.dense, self.dense_bias), approximate=self.spec.gelu_approximate))
        else:
            x = self.norm(x)
        w = self.output.weight
        if w is None:
            w = tied_weight if tied_weight is not None else self.word_weight
        logits = self.output(x, weight=w)
        if self.transform:
            logits = logits + self.decoder_bias
        mask_padded_vocab(logits, self.spec.vocab_size, self.tp)
        s, b, vl = logits.shape
        losses = vocab_parallel_cross_entropy(logits.reshape(s * b, vl), labels.reshape(-1), self.tp, IGNORE_INDEX)
        return losses.sum(), (labels != IGNORE_INDEX).sum()


class Stage(nn.Module):
    """(optional embedding) + layers[start:end] + (optional head). Layers are keyed by their global
    index, so parameter names are the same under every pipeline split (checkpoints rely on it)."""

    def __init__(self, spec: ModelSpec, groups, layer_start: int, layer_end: int, has_embedding: bool,
                 has_head: bool, layer_modes: list[str], overlap: bool = True):
        super().__init__()
        assert len(layer_modes) == layer_end - layer_start, "one recompute mode per layer"
        self.spec, self.groups = spec, groups
        self.layer_start, self.layer_end = layer_start, layer_end
        self.embedding = Embedding(spec, groups) if has_embedding else None
        self.layers = nn.ModuleDict({str(i): TransformerLayer(spec, groups, m, overlap)
                                     for i, m in zip(range(layer_start, layer_end), layer_modes)})
        own_copy = spec.tie_embeddings and has_head and not has_embedding
        self.head = Head(spec, groups, overlap, own_copy) if has_head else None

    def forward(self, inputs, positions=None, token_types=None, labels=None):
        """inputs: tokens [b, s] on the first stage, else hidden [s/t, b, h] from the previous stage.
        positions [s] (global positions of this rank's tokens; context parallelism reorders them).
        Returns hidden [s/t, b, h], or on the last stage (loss sum fp32, labelled-token count)."""
        if self.embedding is not None:
            tokens = inputs.t()
            s = tokens.shape[0]
            if positions is None:
                positions = torch.arange(s, device=tokens.device)
            x = self.embedding(tokens, positions, token_types.t() if token_types is not None else None)
        else:
            x = inputs
            if positions is None:
                positions = torch.arange(x.shape[0] * group_size(self.groups.tp), device=x.device)
        rope = rotary_tables(positions, self.spec) if not self.spec.learned_positions else None
        for layer in self.layers.values():
            x = layer(x, rope)
        if self.head is None:
            return x
        tied = self.embedding.word.weight if (self.spec.tie_embeddings and self.embedding is not None) else None
        return self.head(x, labels.t(), tied)


def build_stage(spec: ModelSpec, groups, layer_start: int, layer_end: int, has_embedding: bool, has_head: bool,
                layer_modes: list[str] | None = None, overlap: bool = True, device="cpu", seed: int = 1234,
                compile: bool = False, fp8: bool = False) -> Stage:
    """Build a stage on `device` in fp32 and initialise it exactly as the TP1 model would be (every logical
    tensor is drawn from a generator seeded by its name, then sliced to this rank's shard).
    compile=True compiles each layer in place with torch.compile (names unchanged; opt-in, as torchtitan).
    fp8=True runs the layers' linear GEMMs in FP8 (runtime/parallel/fp8.py); the embedding and the output
    layer stay in the compute dtype."""
    modes = layer_modes or ["none"] * (layer_end - layer_start)
    with torch.device(device):  # uninitialised storage; init_weights fills every tensor
        stage = Stage(spec, groups, layer_start, layer_end, has_embedding, has_head, modes, overlap)
    if torch.device(device).type != "meta":  # meta: shapes only (parameter counts, memory estimates)
        init_weights(stage, groups, seed)
    if fp8:
        from runtime.parallel.tensor import enable_fp8
        for layer in stage.layers.values():
            enable_fp8(layer)
    if compile:
        for layer in stage.layers.values():
            layer.compile()
    return stage


def build_model(spec: ModelSpec, groups, layer_modes=None, **kw) -> Stage:
    return build_stage(spec, groups, 0, spec.num_layers, True, True, layer_modes, **kw)


def logical_name(name: str, p) -> str:
    """p's name in checkpoints: its own `logical_name`, or its module path with the last part replaced by
    `logical_leaf` (SharedKVQKVLinear's parameters are the fused qkv's parts), or its module path."""
    leaf = getattr(p, "logical_leaf", None)
    if leaf is not None:
        return f"{name.rsplit('.', 1)[0]}.{leaf}"
    return getattr(p, "logical_name", name)


@torch.no_grad()
def init_weights(stage: nn.Module, groups, seed: int = 1234):
    t, r = group_size(groups.tp), group_rank(groups.tp)
    for name, p in stage.named_parameters():
        kind = p.init
        full_shape = list(p.shape)
        if p.tp_dim is not None:
            full_shape[p.tp_dim] *= t
        if kind[0] == "ones":
            p.fill_(1.0)
        elif kind[0] == "zeros":
            p.zero_()
        else:
            g = torch.Generator(device=p.device).manual_seed(seed + zlib.crc32(logical_name(name, p).encode()))
            full = torch.empty(full_shape, device=p.device).normal_(0.0, kind[1], generator=g)
            p.copy_(local_shard(full, p.tp_dim, p.tp_parts, r, t))
