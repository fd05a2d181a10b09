"""FP8 GEMMs for the transformer layers' linear layers, through PyTorch's own `torch._scaled_mm`.

What runs in FP8 (a plan with `layout.fp8`): the forward GEMM (input and weight in E4M3) and the input-gradient
GEMM (output gradient in E5M2, weight in E4M3) of the column- and row-parallel linears of every transformer
layer. The weight-gradient GEMM stays in bf16, accumulated into the fp32 main gradient as before, and the
embedding, the output layer, attention and the norms stay in bf16: the split Transformer Engine's default
recipe and Megatron-LM's FP8 training use for the GEMMs most sensitive to precision.

Scaling: per tensor, from the tensor's own absolute maximum at the time of the GEMM ("current scaling"):
scale = FP8 max / amax, the quantised tensor is clamp(x * scale), and the GEMM multiplies by 1 / scale of each
operand. No history, no host synchronisation (amax and scales stay on the device). Under tensor parallelism
each rank scales its own shard, so FP8 results agree with a one-process FP8 run within FP8 precision, not
bit for bit.

Why not Transformer Engine: the issue asked for it as an optional extra; it is not on the lent machines
(no network there, and its wheels need a CUDA toolkit build against this torch), while `torch._scaled_mm`
ships with torch, runs the same Hopper FP8 tensor-core GEMMs (cuBLASLt), and also runs on CPU, so the tests
check the numerics without a GPU. A GPU without FP8 tensor cores (before compute capability 8.9) is refused
in one sentence by `check_fp8_device`.

GEMM shapes must be multiples of 16 in every dimension; a GEMM that is not runs in the compute dtype.
"""
from __future__ import annotations

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
MIN_CAPABILITY = (8, 9)
"""Ada (8.9) and Hopper (9.0) and newer have FP8 tensor cores."""


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


def quantize(x: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in `dtype` scaled to its range, the fp32 scalar that multiplies it back)."""
    fmax = FP8_MAX[dtype]
    amax = x.detach().abs().amax().float().clamp_min(1e-12)
    scale = fmax / amax
    q = (x.detach() * scale.to(x.dtype)).clamp_(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


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
    y = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, bias=bias, out_dtype=x.dtype)
    return y.view(*x.shape[:-1], n)


def input_grad(grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """grad_y @ weight with the gradient in E5M2 and the weight in E4M3. The weight is quantised again rather
    than kept from the forward: keeping it would hold a byte per weight per micro-batch in flight."""
    g2 = grad_y.reshape(-1, grad_y.shape[-1])
    n, k = weight.shape
    if not fits(g2.shape[0], n, k):
        return grad_y.matmul(weight)
    gq, sg = quantize(g2, E5M2)
    # _scaled_mm wants its second operand column-major: the weight's transpose, quantised, made contiguous
    wtq, sw = quantize(weight.t().contiguous(), E4M3)
    dx = torch._scaled_mm(gq, wtq.t(), scale_a=sg, scale_b=sw, out_dtype=grad_y.dtype)
    return dx.view(*grad_y.shape[:-1], k)
