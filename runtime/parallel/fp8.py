"""FP8 GEMMs for the transformer layers' linear layers, through PyTorch's own `torch._scaled_mm`.

What runs in FP8 (a plan with `layout.fp8`): the forward GEMM (input and weight in E4M3) and the input-gradient
GEMM (output gradient in E5M2, weight in E4M3) of the column- and row-parallel linears of every transformer
layer. The weight-gradient GEMM stays in bf16, accumulated into the fp32 main gradient as in a bf16 plan, and the
embedding, the output layer, attention and the norms stay in bf16: the split Transformer Engine's default
recipe and Megatron-LM's FP8 training use for the GEMMs most sensitive to precision.

Scaling: per tensor, from the tensor's own absolute maximum at the time of the GEMM ("current scaling"):
scale = FP8 max / amax, the quantised tensor is clamp(x * scale), and the GEMM multiplies by 1 / scale of each
operand. No history, no host synchronisation (amax and scales stay on the device). Under tensor parallelism
each rank scales its own shard, so FP8 results agree with a one-process FP8 run within FP8 precision, not
bit for bit.

Why the quantisation is fused: quantising in PyTorch operations (abs, amax, float, clamp_min, divide, multiply,
clamp_, cast: about 8 memory passes per operand, several writing bf16 copies, and the weight's transpose made
contiguous in bf16 for every input-gradient GEMM) leaves training slower than bf16 although its FP8 GEMMs are
faster: GPT-1.3B 0.176 s per step against 0.137 s, GPT-6.7B TP1 0.434 against 0.341, TP2 0.261 against 0.198.
On CUDA, `quantize` therefore makes two passes: one reduction
for amax (`torch.linalg.vector_norm(x, inf)`: one kernel, no abs copy) and one Triton kernel that scales,
clamps and casts (reads 2 bytes, writes 1 per element; the scale is computed on the device inside it). For
the input-gradient GEMM that kernel writes the weight's transpose directly: `_scaled_mm` (cuBLASLt FP8) wants
both operands contiguous along the reduced dimension, n for grad_y @ W, and W [n, k] is contiguous along k,
so one transposing write is needed; it is the cast's own write. The kernel gives the same bits as the eager
version (`quantize_eager`; its bf16 rounding of the product before the FP8 rounding included); the tests
check that under Triton's interpreter, where the roundings are emulated in integer arithmetic. Elsewhere
(CPU, no Triton) `quantize_eager` runs; if the Triton kernel fails to build or launch, it takes over with
one warning.

The weight's FP8 copy is not kept from the forward for the backward: keeping it would hold a byte per weight
per micro-batch in flight, and a per-step cache cannot be keyed on the weight's version counter (the
optimizer writes the weights through the flat buffer they view, `p.data = flat[...]`, which leaves the
Parameter's `_version` unchanged; the Triton AdamW writes through pointers), so a stale copy would go
unnoticed. The input-gradient GEMM quantises the weight again (2 + 2 + 1 bytes per weight).

Why not Transformer Engine: it would be an optional extra whose wheels need a CUDA toolkit build against the
installed torch, while `torch._scaled_mm` ships with torch, runs the same Hopper FP8 tensor-core GEMMs (cuBLASLt), and also runs on CPU, so the tests
check the numerics without a GPU. A GPU without FP8 tensor cores (before compute capability 8.9) is refused
in one sentence by `check_fp8_device`.

GEMM shapes must be multiples of 16 in every dimension; a GEMM that is not runs in the compute dtype.
"""
from __future__ import annotations

import warnings

import torch

from runtime.triton_support import tl, triton, use_triton

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
_FORMAT = {E4M3: (3, -6), E5M2: (2, -14)}
"""(mantissa bits, smallest normal exponent) of each FP8 format: its grid, for the kernel's rounding."""
MIN_CAPABILITY = (8, 9)
"""Ada (8.9) and Hopper (9.0) and newer have FP8 tensor cores."""
_BLOCK = 4096            # elements per program of the row-major cast
_TILE = (64, 64)         # (rows, columns) of the input per program of the transposing cast
_fused_failed: str | None = None
"""Why the Triton quantisation failed once in this process (then the eager one runs); None while it works."""


def check_fp8_device(device) -> str | None:
    """None when FP8 GEMMs run on `device`; else the sentence that says why not."""
    device = torch.device(device)
    if device.type != "cuda":
        return None  # torch._scaled_mm runs on CPU (slowly): the CPU tests use it
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return (f"this plan asks for FP8 GEMMs, which need an NVIDIA GPU of compute capability "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper), but "
                f"{torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}; plan again without --fp8")
    return None


def quantize_eager(x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference quantisation in PyTorch operations (CPU runs; the fused kernel computes the same bits).
    Note the order it fixes: fmax / amax is reciprocal(amax) * fmax (Tensor.__rtruediv__), the scale is
    rounded to x's dtype before the product, and the product is rounded to x's dtype before the FP8 cast."""
    fmax = FP8_MAX[dtype]
    amax = x.detach().abs().amax().float().clamp_min(1e-12)
    scale = fmax / amax
    q = (x.detach() * scale.to(x.dtype)).clamp_(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


def quantize(x: torch.Tensor, dtype, transpose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in `dtype` scaled to its range, the fp32 scalar that multiplies it back). transpose=True (x 2-D):
    the first is x.t() quantised, contiguous (the same bits as quantising x.t().contiguous()).
    Two passes over x where Triton runs (CUDA, or its interpreter): amax, then scale-clamp-cast."""
    global _fused_failed
    if (_fused_failed is None and x.dtype in (torch.bfloat16, torch.float32) and use_triton(x.device)
            and (x.dim() == 2 or not transpose) and x.numel() > 0):
        try:
            return _quantize_triton(x, dtype, transpose)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # a Triton build or launch failure: the eager version still gives the result
            _fused_failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"runtime/parallel/fp8.py: the fused FP8 quantisation failed ({_fused_failed:.300}); "
                          f"using the unfused PyTorch one from now on (slower)", stacklevel=2)
    q, inv = quantize_eager(x, dtype)
    return (q.t().contiguous() if transpose else q), inv


if triton is not None:
    @triton.jit
    def _bf16_rne(v):
        """fp32 -> the nearest bfloat16 value (ties to even), kept in fp32, in integer arithmetic: Triton's
        interpreter truncates in its own fp32 -> bf16 cast."""
        b = v.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return tl.where(v != v, v, b.to(tl.float32, bitcast=True))

    @triton.jit
    def _fp8_rne(v, MANT: tl.constexpr, EMIN: tl.constexpr):
        """fp32 v (|v| <= the format's max, or NaN) -> the nearest value of the FP8 grid with MANT mantissa bits
        and smallest normal exponent EMIN (subnormals included; ties to even; the sign of zero kept), in fp32:
        the cast to FP8 afterwards is exact (Triton's interpreter's own FP8 cast rounds ties up, mishandles
        carries into the exponent and subnormals). Every step is exact: power-of-two scalings, an integer round."""
        bits = v.to(tl.uint32, bitcast=True)
        mag = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
        e = ((bits >> 23) & 0xFF).to(tl.int32) - 127
        k = MANT - tl.maximum(e, EMIN)                          # one grid step is 2^-k
        w = mag * ((k + 127) << 23).to(tl.float32, bitcast=True)  # in [0, 2^(MANT + 1)]
        n = w.to(tl.int32)
        f = w - n.to(tl.float32)
        n = n + ((f > 0.5) | ((f == 0.5) & ((n & 1) == 1))).to(tl.int32)
        r = n.to(tl.float32) * ((127 - k) << 23).to(tl.float32, bitcast=True)
        r = (r.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
        return tl.where(v != v, v, r)

    @triton.jit
    def _scales(amax_ptr, FMAX: tl.constexpr, BF16: tl.constexpr):
        """(the multiplier as quantize_eager applies it, the fp32 inverse scale it returns), from amax."""
        amax = tl.maximum(tl.load(amax_ptr).to(tl.float32), 1e-12, propagate_nan=tl.PropagateNan.ALL)
        one = tl.full((), 1.0, tl.float32)
        scale = tl.div_rn(one, amax) * FMAX  # fmax / amax as torch computes it: reciprocal, then multiply
        inv = tl.div_rn(one, scale)
        if BF16:
            mult = _bf16_rne(scale)
        else:
            mult = scale
        return mult, inv

    @triton.jit
    def _quantise(x, mult, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, BF16: tl.constexpr,
                  EMULATE: tl.constexpr):
        """clamp(x * mult) rounded as quantize_eager rounds it, in fp32, for the caller's cast to FP8. EMULATE
        (Triton's interpreter): the roundings in integer arithmetic, leaving the cast exact. On CUDA the
        hardware's conversions (round to nearest even, as PyTorch's) do them: the emulation's ~30 extra
        instructions per element could make this pass compute-bound (an estimate, not measured)."""
        y = x.to(tl.float32) * mult  # exact for bf16 x: 8-bit by 8-bit significands
        if BF16:                      # quantize_eager multiplies in bf16
            if EMULATE:
                y = _bf16_rne(y)
            else:
                y = y.to(tl.bfloat16).to(tl.float32)
        y = tl.minimum(tl.maximum(y, -FMAX, propagate_nan=tl.PropagateNan.ALL), FMAX,
                       propagate_nan=tl.PropagateNan.ALL)
        if EMULATE:
            y = _fp8_rne(y, MANT, EMIN)
        return y

    @triton.jit
    def _cast_kernel(x_ptr, q_ptr, amax_ptr, inv_ptr, n, FMAX: tl.constexpr, MANT: tl.constexpr,
                     EMIN: tl.constexpr, BF16: tl.constexpr, EMULATE: tl.constexpr, BLOCK: tl.constexpr):
        """q = fp8(clamp(x * scale)) over a contiguous x of n elements; program 0 also writes 1 / scale."""
        pid = tl.program_id(0)
        mult, inv = _scales(amax_ptr, FMAX, BF16)
        tl.store(inv_ptr, inv, mask=pid == 0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        q = _quantise(x, mult, FMAX, MANT, EMIN, BF16, EMULATE)
        tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _cast_t_kernel(x_ptr, q_ptr, amax_ptr, inv_ptr, rows, cols, stride_r, stride_c, FMAX: tl.constexpr,
                       MANT: tl.constexpr, EMIN: tl.constexpr, BF16: tl.constexpr, EMULATE: tl.constexpr,
                       BR: tl.constexpr, BC: tl.constexpr):
        """q[cols, rows] (contiguous) = fp8(clamp(x * scale)).t() for a 2-D x [rows, cols] of any strides."""
        pr, pc = tl.program_id(0), tl.program_id(1)
        mult, inv = _scales(amax_ptr, FMAX, BF16)
        tl.store(inv_ptr, inv, mask=(pr == 0) & (pc == 0))
        r = pr.to(tl.int64) * BR + tl.arange(0, BR)
        c = pc.to(tl.int64) * BC + tl.arange(0, BC)
        mask = (r[:, None] < rows) & (c[None, :] < cols)
        x = tl.load(x_ptr + r[:, None] * stride_r + c[None, :] * stride_c, mask=mask, other=0.0)
        q = _quantise(x, mult, FMAX, MANT, EMIN, BF16, EMULATE)
        tl.store(q_ptr + c[None, :] * rows + r[:, None], q.to(q_ptr.dtype.element_ty), mask=mask)


def _quantize_triton(x: torch.Tensor, dtype, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach()
    amax = torch.linalg.vector_norm(x, float("inf"))  # max |x|, one reduction, in x's dtype (exact)
    inv = torch.empty((), dtype=torch.float32, device=x.device)
    mant, emin = _FORMAT[dtype]
    kw = dict(FMAX=FP8_MAX[dtype], MANT=mant, EMIN=emin, BF16=x.dtype == torch.bfloat16,
              EMULATE=x.device.type != "cuda")
    if transpose:
        rows, cols = x.shape
        q = torch.empty((cols, rows), dtype=dtype, device=x.device)
        br, bc = _TILE
        _cast_t_kernel[(triton.cdiv(rows, br), triton.cdiv(cols, bc))](
            x, q, amax, inv, rows, cols, x.stride(0), x.stride(1), BR=br, BC=bc, **kw)
        return q, inv
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    _cast_kernel[(triton.cdiv(x.numel(), _BLOCK),)](x, q, amax, inv, x.numel(), BLOCK=_BLOCK, num_warps=8, **kw)
    return q, inv


def fits(*dims: int) -> bool:
    return all(d % 16 == 0 and d > 0 for d in dims)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) with E4M3 operands (in x's dtype when the shape does not fit FP8)."""
    x2 = x.reshape(-1, x.shape[-1])
    n, k = weight.shape
    if not fits(x2.shape[0], k, n):
        return torch.nn.functional.linear(x, weight, bias)
    xq, sx = quantize(x2, E4M3)
    wq, sw = quantize(weight, E4M3)
    # W [n, k] row-major is W^T [k, n] column-major: the second operand as _scaled_mm wants it, no copy
    y = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, bias=bias, out_dtype=x.dtype)
    return y.view(*x.shape[:-1], n)


def input_grad(grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """grad_y @ weight with the gradient in E5M2 and the weight in E4M3. The weight is quantised again rather
    than kept from the forward (see the module docstring)."""
    g2 = grad_y.reshape(-1, grad_y.shape[-1])
    n, k = weight.shape
    if not fits(g2.shape[0], n, k):
        return grad_y.matmul(weight)
    gq, sg = quantize(g2, E5M2)
    # _scaled_mm wants W [n, k] column-major, contiguous along n: W^T quantised and written row-major [k, n]
    # in the same pass (amax of W is amax of W^T); on CPU the 1-byte result is transposed instead
    wtq, sw = quantize(weight, E4M3, transpose=True)
    dx = torch._scaled_mm(gq, wtq.t(), scale_a=sg, scale_b=sw, out_dtype=grad_y.dtype)
    return dx.view(*grad_y.shape[:-1], k)
