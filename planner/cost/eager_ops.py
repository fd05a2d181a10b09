"""The memory-bound kernels of torchtitan's Llama 3 transformer block as eager PyTorch runs it (no torch.compile),
per layer and micro-batch on one rank: each op of the model code is a kernel of its own, RMSNorm and rotary upcast
to fp32, and autograd runs its own kernels for their backward (RuntimeTarget.eager_llama_elementwise; priced by
eager_llama_elementwise_s for planner/cost/layer.py LayerTerms._elementwise_s).

The model is torchtitan's at the commit its published benchmarks ran (pytorch/torchtitan 9dec370,
torchtitan/models/llama/model.py and torchtitan/models/norms.py):
- RMSNorm: `self._norm(x.float()).type_as(x) * self.weight`, `_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1,
  keepdim=True) + eps)`; under FSDP2's bf16 parameters the weight is bf16;
- rotary: `torch.view_as_complex(xq.float().reshape(..., -1, 2))`, times the complex64 `freqs_cis`,
  `view_as_real(...).flatten(3)`, `type_as(xq)`, for q and for k (the reshapes and complex views move no data);
- `repeat_kv` of k and v before `F.scaled_dot_product_attention` (`unsqueeze().expand().reshape()`, a copy when the
  query heads outnumber the KV heads); the attention output's `transpose(1, 2).contiguous()` is free (SDPA's flash
  kernel writes [batch, seq, heads, dim]);
- the FeedForward `w2(F.silu(w1(x)) * w3(x))`; the residual adds `h = x + attention(...)`, `out = h + ffn(...)`.

Backward is autograd's derivative of each op as PyTorch writes it: `type_as` / `.float()` backward a cast of the
gradient; mul's backward a product per input that requires grad (a broadcast input's reduced by a sum); rsqrt's
`-0.5 * grad * result.pow(3)`; mean's `grad.expand(...) / n`; pow's `grad * (2 * self.pow(1))` (pow by 1 is a copy);
expand's a sum; silu's `silu_backward`; the complex mul's `grad * freqs_cis.conj()` (the table's conjugate
materialised first). A tensor read by k ops gets k - 1 gradient accumulations (an add each): x_f inside each norm
(pow and mul), the attention norm's output (wq, wk, wv), the FFN norm's output (w1, w3), and the block's input and
h (a norm and a residual add each). A CPU trace of the block written this way (aten ops under a
TorchDispatchMode, forward, backward and selective recompute) lists these kernels and no others beside the GEMMs
and the attention.

Selective recompute is torchtitan's op-level SAC (torchtitan/parallelisms/parallelize_llama.py, `_save_list` and
`_custom_policy`): the outputs of the flash / efficient SDPA and of every other mm are saved, everything else is
recomputed by rerunning the block's forward in backward until the last saved tensor is rebuilt (torch.utils.
checkpoint's early stop): every elementwise kernel of the forward but the last residual add (the GEMM w2, whose
input is the last tensor autograd saves, precedes it). The mms it reruns (wk, wo, w3) and the attention it does
not are GEMM and attention terms, not priced here.

Byte counts are what each kernel reads and writes in DRAM (bf16 2 B, fp32 4 B, complex64 8 B per element); the
small per-row tensors ([rows, 1] statistics) and the rotary table are counted too, and a broadcast operand is read
once."""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import PlanError

BF16 = 2
FP32 = 4
COMPLEX64 = 8


@dataclass(frozen=True)
class EagerKernel:
    """One eager kernel: the op it runs and the bytes it reads and writes (per layer and micro-batch, one rank)."""
    op: str
    read_bytes: float
    write_bytes: float

    @property
    def nbytes(self) -> float:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class LlamaBlockShape:
    """One block's elementwise tensors on one rank for one micro-batch."""
    norm_rows: float
    """Rows the norms and residual adds run over: this rank's sequence shard of the micro-batch's tokens (tokens / TP
    under sequence parallelism)."""
    proj_rows: float
    """Rows of the projections' outputs (rotary, repeat_kv, SwiGLU): the micro-batch's tokens on this rank."""
    hidden: int
    q_width: int
    """This rank's query heads times the head dimension."""
    kv_width: int
    """This rank's KV heads times the head dimension."""
    ffn_width: int
    """This rank's share of the FFN hidden width."""
    rotary_entries: float
    """Complex entries of the rotary table one call reads: positions of the rank's sequence times head_dim / 2."""


@dataclass(frozen=True)
class EagerBlockKernels:
    """The block's eager elementwise kernels: forward, backward, and what selective recompute reruns."""
    forward: tuple[EagerKernel, ...]
    backward: tuple[EagerKernel, ...]
    recompute: tuple[EagerKernel, ...]


def _k(op: str, read_bytes: float, write_bytes: float) -> EagerKernel:
    return EagerKernel(op, read_bytes, write_bytes)


def rmsnorm_forward(rows: float, h: int) -> list[EagerKernel]:
    """RMSNorm forward over [rows, h] bf16: 36 B per element of the input, 8 kernels (2 of them on [rows, 1] only)."""
    e = rows * h
    return [_k("norm.float", BF16 * e, FP32 * e), _k("norm.pow", FP32 * e, FP32 * e),
            _k("norm.mean", FP32 * e, FP32 * rows), _k("norm.add_eps", FP32 * rows, FP32 * rows),
            _k("norm.rsqrt", FP32 * rows, FP32 * rows), _k("norm.mul_rstd", FP32 * (e + rows), FP32 * e),
            _k("norm.type_as", FP32 * e, BF16 * e), _k("norm.mul_weight", BF16 * (e + h), BF16 * e)]


def rmsnorm_backward(rows: float, h: int) -> list[EagerKernel]:
    """RMSNorm backward over [rows, h]: 92 B per element, 16 kernels (3 of them on [rows, 1] only); the weight's
    gradient summed over the rows in bf16."""
    e = rows * h
    return [_k("norm.grad_y", BF16 * (e + h), BF16 * e), _k("norm.grad_weight_mul", 2 * BF16 * e, BF16 * e),
            _k("norm.grad_weight_sum", BF16 * e, BF16 * h), _k("norm.type_as_bwd", BF16 * e, FP32 * e),
            _k("norm.grad_x_mul", FP32 * (e + rows), FP32 * e), _k("norm.grad_rstd_mul", 2 * FP32 * e, FP32 * e),
            _k("norm.grad_rstd_sum", FP32 * e, FP32 * rows), _k("norm.rsqrt_bwd_pow", FP32 * rows, FP32 * rows),
            _k("norm.rsqrt_bwd_scale", FP32 * rows, FP32 * rows),
            _k("norm.rsqrt_bwd_mul", 2 * FP32 * rows, FP32 * rows), _k("norm.mean_bwd_div", FP32 * rows, FP32 * e),
            _k("norm.pow_bwd_copy", FP32 * e, FP32 * e), _k("norm.pow_bwd_scale", FP32 * e, FP32 * e),
            _k("norm.pow_bwd_mul", 2 * FP32 * e, FP32 * e), _k("norm.accumulate_grad", 2 * FP32 * e, FP32 * e),
            _k("norm.float_bwd", FP32 * e, BF16 * e)]


def rotary_forward(rows: float, width: int, table: float) -> list[EagerKernel]:
    """Rotary forward of one of q, k ([rows, width] bf16): 20 B per element and the table, 3 kernels."""
    e = rows * width
    return [_k("rotary.float", BF16 * e, FP32 * e), _k("rotary.complex_mul", FP32 * e + COMPLEX64 * table, FP32 * e),
            _k("rotary.type_as", FP32 * e, BF16 * e)]


def rotary_backward(rows: float, width: int, table: float) -> list[EagerKernel]:
    """Rotary backward of one of q, k: 20 B per element and the table twice, 4 kernels."""
    e = rows * width
    return [_k("rotary.type_as_bwd", BF16 * e, FP32 * e), _k("rotary.conj_table", COMPLEX64 * table, COMPLEX64 * table),
            _k("rotary.complex_mul_bwd", FP32 * e + COMPLEX64 * table, FP32 * e),
            _k("rotary.float_bwd", FP32 * e, BF16 * e)]


def repeat_kv(rows: float, kv_width: int, q_width: int, backward: bool) -> list[EagerKernel]:
    """repeat_kv of one of k, v: forward a copy from the KV heads to the query heads, backward a sum back; nothing
    where they are as many."""
    if q_width <= kv_width:
        return []
    kv, q = BF16 * rows * kv_width, BF16 * rows * q_width
    return [_k("repeat_kv.sum", q, kv)] if backward else [_k("repeat_kv.copy", kv, q)]


def swiglu_forward(rows: float, f: int) -> list[EagerKernel]:
    """silu(w1 x) * w3 x over [rows, f] bf16: 10 B per element, 2 kernels."""
    e = rows * f
    return [_k("swiglu.silu", BF16 * e, BF16 * e), _k("swiglu.mul", 2 * BF16 * e, BF16 * e)]


def swiglu_backward(rows: float, f: int) -> list[EagerKernel]:
    """The product's two gradients and silu_backward: 18 B per element, 3 kernels."""
    e = rows * f
    return [_k("swiglu.grad_gate", 2 * BF16 * e, BF16 * e), _k("swiglu.grad_up", 2 * BF16 * e, BF16 * e),
            _k("swiglu.silu_bwd", 2 * BF16 * e, BF16 * e)]


def bf16_add(op: str, rows: float, width: int) -> EagerKernel:
    """A bf16 add of two [rows, width] tensors (a residual add, or autograd accumulating a gradient)."""
    e = rows * width
    return _k(op, 2 * BF16 * e, BF16 * e)


def torchtitan_llama_block_kernels(s: LlamaBlockShape) -> EagerBlockKernels:
    """The eager elementwise kernels of one torchtitan Llama block, in the order they run."""
    n, r, h = s.norm_rows, s.proj_rows, s.hidden
    attention_side = rotary_forward(r, s.q_width, s.rotary_entries) + rotary_forward(r, s.kv_width, s.rotary_entries) \
        + 2 * repeat_kv(r, s.kv_width, s.q_width, backward=False)
    forward = rmsnorm_forward(n, h) + attention_side + [bf16_add("residual_add", n, h)] + rmsnorm_forward(n, h) \
        + swiglu_forward(r, s.ffn_width) + [bf16_add("residual_add", n, h)]
    backward = swiglu_backward(r, s.ffn_width) + [bf16_add("accumulate_grad.w1_w3", r, h)] \
        + rmsnorm_backward(n, h) + [bf16_add("accumulate_grad.h", n, h)] \
        + 2 * repeat_kv(r, s.kv_width, s.q_width, backward=True) \
        + rotary_backward(r, s.kv_width, s.rotary_entries) + rotary_backward(r, s.q_width, s.rotary_entries) \
        + 2 * [bf16_add("accumulate_grad.wq_wk_wv", r, h)] + rmsnorm_backward(n, h) \
        + [bf16_add("accumulate_grad.x", n, h)]
    return EagerBlockKernels(tuple(forward), tuple(backward), tuple(forward[:-1]))


def llama_block_shape(m, lay, tokens: float, seq_len: int) -> LlamaBlockShape:
    """The block's tensors for model `m` (planner.model.ModelSpec) under layout `lay` with `tokens` tokens of a
    micro-batch on the rank: the norms and residual adds over its sequence shard (tokens / TP, sequence parallel),
    the rest over its tokens and its heads' and FFN columns. Raises PlanError for a layer that is not a dense Llama
    layer, the only one whose eager ops are counted here."""
    fam = m.model_family
    if (fam.norm, fam.mlp, fam.positions) != ("rmsnorm", "swiglu", "rotary") or fam.post_norm or m.is_moe \
            or m.qk_norm or m.has_qkv_bias or m.has_attn_out_bias or m.has_bias:
        raise PlanError(f"model '{m.name}' is not a dense Llama layer (RMSNorm, SwiGLU, rotary, no biases or q/k "
                        "norms), the only one whose eager elementwise ops the cost model counts")
    t, T = lay.tp, int(tokens)
    return LlamaBlockShape(norm_rows=T / t, proj_rows=T, hidden=m.hidden, q_width=m.q_width // t,
                           kv_width=m.kv_heads_local(t) * m.head_dim, ffn_width=m.ffn_hidden // t,
                           rotary_entries=seq_len // lay.cp * m.head_dim / 2)


def eager_llama_elementwise_s(m, lay, tokens: float, seq_len: int, prof) -> tuple[float, float, float]:
    """(forward, backward, selective recompute) seconds of the block's eager elementwise kernels on one rank, each at
    the profile's memory-bound rate with one launch (planner.profile.Profile.memory_bound_s); uncalibrated."""
    kernels = torchtitan_llama_block_kernels(llama_block_shape(m, lay, tokens, seq_len))
    f, b, r = (sum(prof.memory_bound_s(k.nbytes) for k in ks)
               for ks in (kernels.forward, kernels.backward, kernels.recompute))
    return f, b, r
