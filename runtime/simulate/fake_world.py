"""One rank of a plan's world in this process, with nothing allocated and nothing computed.

`fake_world(rank, world_size)` joins PyTorch's fake process-group backend (every collective returns at once,
its output tensors untouched) as `rank` of `world_size`; `fake_device()` enters a FakeTensorMode in which every
tensor, parameter and buffer the runtime creates carries only its shape, dtype and device.

The simulated device is the CPU, in the GPU's compute dtype (bf16), with the GPU's kernels where they decide
what is kept for backward:
  * the runtime's Triton paths are taken (`use_triton` is true on CPU under TRITON_INTERPRET=1, which
    `prepare_process()` sets before Triton is imported) and every `kernel[grid](...)` launch returns without
    running: the wrapper around it has already allocated the kernel's outputs with their real shapes and
    dtypes, and its autograd function saves exactly the tensors it saves on a GPU;
  * scaled_dot_product_attention runs the flash-attention operator (what an H100/H200 runs for bf16 with
    head_dim <= 256), whose fake kernel gives the output and the fp32 log-sum-exp kept for backward; the CPU's
    math kernel would keep the [s, s] probabilities instead; ring attention's blocks likewise (`_gpu_ring_attention`).
Why not a fake "cuda" device: a CPU-only PyTorch has no CUDA device guard (indexing sets one) and its autograd
engine refuses CUDA tensors without an accelerator, so backward cannot run there.
MoE layers run their grouped GEMMs and an evenly balanced routing (`_gpu_experts`).
Other branches on `tensor.is_cuda` still take their CPU side (runtime/simulate/run.py, CPU_SIDE_BRANCHES, lists them).
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F


def prepare_process() -> None:
    """Before the runtime (and so Triton) is imported: the runtime's Triton paths are taken on CPU tensors."""
    os.environ["TRITON_INTERPRET"] = "1"


def fake_world(rank: int, world_size: int) -> None:
    """Initialise torch.distributed as `rank` of `world_size` on the fake backend (no other process exists)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def gpu_layout(q: torch.Tensor) -> torch.Tensor:
    """q [b, heads, s, d] with its sequence outside its heads in memory, the order of the layout the CUDA flash
    kernel writes its output in ([b, s, heads, d], transposed). The operator's fake implementation allocates the
    output like q (empty_like keeps q's stride order), so handing q over in that order gives the output the GPU's
    strides: its permute to [s, b, heads * d] for the output projection is then a view, as on the GPU, not a second
    copy of the attention output. A q already in that order (a view into the QKV GEMM's [s, b, ...] output) is
    handed over as it is; a q laid out heads-outer (the rotary's fresh output, which nothing else keeps) is copied,
    and the copy replaces it."""
    if q.stride(1) > q.stride(2):
        return q.transpose(1, 2).contiguous().transpose(1, 2)
    return q


def _flash_sdpa(q, k, v, is_causal, scale):
    """The flash-attention operator, with k and v at their own head count under GQA as the GPU's kernel takes them,
    its output in the GPU's layout (gpu_layout)."""
    return torch.ops.aten._scaled_dot_product_flash_attention(gpu_layout(q), k, v, 0.0, is_causal, False,
                                                              scale=scale)[0]


@contextlib.contextmanager
def _gpu_attention():
    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is None and dropout_p == 0.0 and q.dtype in (torch.bfloat16, torch.float16) \
                and q.size(-1) <= 256:
            return _flash_sdpa(q, k, v, is_causal, scale)
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


@contextlib.contextmanager
def _gpu_ring_attention():
    """Ring attention's block kernel as on a GPU: flash attention wherever the GPU would run flash or cuDNN (both
    keep the block's output and its fp32 log-sum-exp), not the CPU's math kernel with its [s, s] scores."""
    import runtime.parallel.context as context

    saved = context._use_flash, context._use_cudnn
    context._use_flash = lambda q: q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) % 8 == 0 \
        and q.size(-1) <= 256
    context._use_cudnn = lambda q: False
    try:
        yield
    finally:
        context._use_flash, context._use_cudnn = saved


def _even(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def balanced_split_sizes(sizes, rows: int, chunks: int, ep: int, local_experts: int) -> list[int]:
    """runtime/parallel/expert_dispatch.host_split_sizes for an evenly balanced routing: each dispatch chunk
    sends its rows evenly to the ep ranks, receives as many as it sends (every rank routes alike), and spreads
    them evenly over the local experts."""
    send = [n for c in _even(rows, chunks) for n in _even(c, ep)]
    local = [n for c in range(chunks) for n in _even(sum(send[c * ep:(c + 1) * ep]), local_experts)]
    return send + list(send) + local


@contextlib.contextmanager
def _gpu_experts():
    """MoE layers as on a Hopper GPU: grouped GEMMs for the local experts (torch._grouped_mm, whose fake kernel
    needs no row counts on the host) and an evenly balanced routing where the dispatch reads its split sizes."""
    import runtime.parallel.expert as expert
    import runtime.parallel.expert_dispatch as dispatch

    saved = expert.grouped_mm_supported, dispatch.host_split_sizes
    expert.grouped_mm_supported = lambda x, *dims: x.dtype == torch.bfloat16 and all(d % 8 == 0 for d in dims)
    dispatch.host_split_sizes = balanced_split_sizes
    try:
        yield
    finally:
        expert.grouped_mm_supported, dispatch.host_split_sizes = saved


@contextlib.contextmanager
def _inert_triton_launches():
    """Every `kernel[grid](...)` launch returns without running: its outputs were allocated by its caller."""
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:  # no Triton: the runtime takes its PyTorch paths
        yield
        return
    original = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original


@contextlib.contextmanager
def _no_weight_init():
    """Parameters keep their fake (value-less) contents: drawing them would only cost time."""
    import runtime.model as model

    original = model.init_weights
    model.init_weights = lambda *args, **kwargs: None
    try:
        yield
    finally:
        model.init_weights = original


@contextlib.contextmanager
def fake_device():
    """Fake tensors for the block, with the GPU's attention and Triton paths: yields the FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with _inert_triton_launches(), _gpu_attention(), _gpu_ring_attention(), _gpu_experts(), _no_weight_init(), mode:
        yield mode
