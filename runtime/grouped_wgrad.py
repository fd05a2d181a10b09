"""The MoE experts' weight gradients, accumulated into their fp32 main gradients by the GEMM itself.

`grouped_wgrad_(main_grad, dy, x, offs, overwrite)`: main_grad[g] (+)= dy[rows of g]^T @ x[rows of g] for every
local expert g, rows grouped by expert as torch._grouped_mm takes them (group g owns rows offs[g-1]:offs[g],
offsets on the device). main_grad is the [experts, N, K] view of the experts' main gradients that
runtime/parallel/flat_buffer.py lays out back to back.

Why: torch._grouped_mm writes a bf16 [experts, N, K] gradient and cannot accumulate, so every micro-batch would
then add it into main_grad (read 2 + 4, write 4 bytes per parameter): 12 ms of the 232 ms of GPU time of a step of
the EP bar's MoE, where the dense layers' weight-gradient GEMMs accumulate in fp32 themselves (runtime/parallel/tensor.py, weight_grad). Here each program owns one [BLOCK_N, BLOCK_K] tile of one
expert's gradient, runs over that expert's rows in fp32, and adds the tile into main_grad (or writes it, on the
step's first micro-batch).

CUDA (tile shapes tuned once per (N, K) on a scratch output, in an eager step, before any CUDA-graph capture) and
Triton's interpreter (tests); callers fall back to torch._grouped_mm elsewhere.
"""
from __future__ import annotations

import torch

from runtime.triton_support import tl, triton, use_triton

if triton is not None:
    @triton.jit
    def _grouped_wgrad_kernel(dy_ptr, x_ptr, offs_ptr, out_ptr, N, K, ACCUMULATE: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
        g = tl.program_id(1)
        tiles_k = tl.cdiv(K, BLOCK_K)
        pn = tl.program_id(0) // tiles_k
        pk = tl.program_id(0) % tiles_k
        start = tl.load(offs_ptr + g - 1, mask=g > 0, other=0).to(tl.int64)
        end = tl.load(offs_ptr + g).to(tl.int64)
        rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = pk * BLOCK_K + tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for r0 in range(start, end, BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            rmask = rr < end
            a = tl.load(dy_ptr + rr[:, None] * N + rn[None, :], mask=rmask[:, None] & (rn < N)[None, :], other=0.0)
            b = tl.load(x_ptr + rr[:, None] * K + rk[None, :], mask=rmask[:, None] & (rk < K)[None, :], other=0.0)
            acc = tl.dot(tl.trans(a), b, acc)
        omask = (rn < N)[:, None] & (rk < K)[None, :]
        out = out_ptr + g.to(tl.int64) * N * K + rn[:, None].to(tl.int64) * K + rk[None, :]
        if ACCUMULATE:
            acc += tl.load(out, mask=omask, other=0.0)
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=omask)

    # the five best of 12 tiles x 2 forms (pointers here; block pointers run 2-5% slower) at the EP bar's shapes:
    # 128 x 256 x 64, 8 warps, 3 stages first, at 88-90% of torch._grouped_mm's CUTLASS kernel (which cannot
    # accumulate); 4-warp and 256 x 256 tiles run 5-8x slower
    _CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_R": br}, num_warps=8, num_stages=s)
                for bn, bk, br, s in ((128, 256, 64, 3), (128, 256, 64, 4), (256, 128, 32, 4), (256, 128, 64, 3),
                                      (128, 128, 64, 3))]
    _grouped_wgrad_tuned = triton.autotune(configs=_CONFIGS, key=["N", "K"])(_grouped_wgrad_kernel)

_TUNED: set = set()


def supported(main_grad: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether grouped_wgrad_ runs here: Triton on the device, contiguous bf16 rows (fp32 under the
    interpreter), a contiguous [experts, N, K] main gradient."""
    # fp32 rows only under the interpreter (tests): on a GPU tl.dot would round them to TF32
    exact = dy.dtype == torch.bfloat16 or (dy.dtype == torch.float32 and dy.device.type == "cpu")
    return (use_triton(dy.device) and dy.dtype == x.dtype and exact
            and dy.is_contiguous() and x.is_contiguous() and main_grad.is_contiguous() and main_grad.dim() == 3
            and main_grad.shape[1:] == (dy.size(1), x.size(1)))


def _launch(out, dy, x, offs, accumulate: bool):
    G, N, K = out.shape
    if dy.device.type != "cuda":  # the interpreter: one fixed tile
        grid = (triton.cdiv(N, 32) * triton.cdiv(K, 32), G)
        _grouped_wgrad_kernel[grid](dy, x, offs, out, N, K, ACCUMULATE=accumulate, BLOCK_N=32, BLOCK_K=32,
                                    BLOCK_R=16)
        return
    _grouped_wgrad_tuned[lambda m: (triton.cdiv(N, m["BLOCK_N"]) * triton.cdiv(K, m["BLOCK_K"]), G)](
        dy, x, offs, out, N, K, ACCUMULATE=accumulate)


def grouped_wgrad_(main_grad: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, offs: torch.Tensor,
                   overwrite: bool) -> None:
    """main_grad[g] = (overwrite) or += dy[rows of g]^T x[rows of g], accumulated in fp32 (see the module doc)."""
    key = (main_grad.shape, dy.dtype, main_grad.dtype, dy.device)
    if dy.device.type == "cuda" and key not in _TUNED:  # autotune on scratch: its trials would add several times
        _launch(torch.empty_like(main_grad), dy, x, offs, False)
        _TUNED.add(key)
    _launch(main_grad, dy, x, offs, not overwrite)
