"""Kernel timings on one device: GEMMs, attention, memory-bound kernels, the optimizer step, launch overhead.

Every kernel is called the way the runtime calls it (F.linear / matmul with autograd's operand layouts,
F.scaled_dot_product_attention, F.layer_norm / F.rms_norm, fused AdamW) on random inputs (never zeros),
rotating through enough input copies that the L2 cache does not flatter the result (see timing.Rotation;
GEMM inputs are views at staggered offsets of one random pool, so rotating costs no set-up time).
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from runtime.profiler.shapes import GemmShape
from runtime.profiler.timing import REHEAT_MAX_S, Timing, synchronize, time_fn


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs (what training runs); fp32 on CPU (the CPU loop checks plumbing, not speed)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _randn(numel: int, device, dtype) -> torch.Tensor:
    return torch.randn(numel, device=device, dtype=dtype)


class RandomPool:
    """One flat random tensor; operands are views at staggered offsets so that consecutive calls read
    different memory (2x L2 apart at least) without generating new random data per shape."""

    def __init__(self, numel: int, device, dtype):
        self.data = torch.empty(numel, device=device, dtype=dtype)
        for lo in range(0, numel, 1 << 28):   # fill in chunks: no huge fp32 temporaries
            self.data[lo:lo + (1 << 28)].normal_()
        self.numel = numel
        self.cursor = 0
        self.stride = 0
        dev = torch.device(device)
        if dev.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
            self.stride = 2 * l2 // self.data.element_size()

    def take(self, numel: int) -> torch.Tensor:
        if numel > self.numel:
            raise ValueError(f"pool of {self.numel} elements cannot hold {numel}")
        if self.cursor + numel > self.numel:
            self.cursor = 0
        v = self.data[self.cursor:self.cursor + numel]
        # next view starts past this one, and at least 2x L2 further, aligned to 256 elements
        self.cursor = (self.cursor + max(numel, self.stride) + 255) // 256 * 256
        if self.cursor >= self.numel:
            self.cursor = 0
        return v


def gemm_pool_numel(shapes: list[GemmShape], device) -> int:
    """Pool big enough for two copies of the largest operand pair (and 4x L2 on GPU)."""
    biggest = max((s.m * s.k + s.k * s.n) for s in shapes) if shapes else 1
    dev = torch.device(device)
    floor = 512 << 20 if dev.type == "cuda" else 1 << 20
    want = int(2.2 * biggest) + floor
    if dev.type == "cuda":   # leave room for outputs and cuBLAS workspaces: at most 40% of free memory
        free, _ = torch.cuda.mem_get_info(dev)
        want = min(want, int(0.4 * free) // 2)
    return want


def gemm_call(shape: GemmShape, pool: RandomPool, device, sets: int):
    """fn(i) running the GEMM with autograd's layouts, rotating over `sets` operand pairs."""
    m, n, k = shape.m, shape.n, shape.k
    pairs = []
    for _ in range(sets):
        if shape.kind in ("fwd", "fp8fwd"):  # x[m,k] @ w[n,k]^T  (F.linear)
            a = pool.take(m * k).view(m, k)
            b = pool.take(n * k).view(n, k)
            pairs.append((a, b))
        elif shape.kind in ("dgrad", "fp8dgrad"):  # dy[m,k] @ w[k,n]
            a = pool.take(m * k).view(m, k)
            b = pool.take(k * n).view(k, n)
            pairs.append((a, b))
        else:                          # wgrad: dy[k,m]^T @ x[k,n]  (tokens are the reduction dimension)
            a = pool.take(k * m).view(k, m)
            b = pool.take(k * n).view(k, n)
            pairs.append((a, b))
    if shape.kind == "fwd":
        return lambda i: F.linear(*pairs[i % sets])
    if shape.kind in ("fp8fwd", "fp8dgrad"):   # as the runtime runs them: both operands scaled on the device
        from runtime.parallel import fp8
        if shape.kind == "fp8fwd":
            return lambda i: fp8.linear(pairs[i % sets][0], pairs[i % sets][1], None)
        return lambda i: fp8.input_grad(*pairs[i % sets])
    if shape.kind == "dgrad":
        return lambda i: torch.matmul(*pairs[i % sets])
    # wgrad as the runtime runs it (gradient-accumulation fusion): accumulated into an fp32 main gradient
    from runtime.parallel.tensor import _accumulate_mm_
    grads = [torch.zeros(m, n, device=device, dtype=torch.float32) for _ in range(min(sets, 2))]
    return lambda i: _accumulate_mm_(grads[i % len(grads)], pairs[i % sets][0].t(), pairs[i % sets][1])


def rotation_sets(set_bytes: int, device) -> int:
    dev = torch.device(device)
    if dev.type != "cuda":
        return 2
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
    return max(2, min(16, math.ceil(2 * l2 / max(set_bytes, 1))))


def timed_gemms(shapes: list[GemmShape], device, *, warmup: int, repeats: int, deadline: float | None = None):
    """Yields (index in `shapes`, Timing, or None when the operands are larger than the pool allows on this
    device) shape by shape, stopping before the first shape reached after `deadline` (time.monotonic()).
    The index lets a caller timing a share of a grid put its points back in the grid's order."""
    device = torch.device(device)
    dtype = compute_dtype(device)
    pool = RandomPool(gemm_pool_numel(shapes, device), device, dtype)
    esize = torch.tensor([], dtype=dtype).element_size()
    for i, s in enumerate(shapes):
        if deadline is not None and time.monotonic() > deadline:
            return
        if 2 * (s.m * s.k + s.k * s.n) > pool.numel:
            yield i, None
            continue
        sets = rotation_sets((s.m * s.k + s.k * s.n) * esize, device)
        fn = gemm_call(s, pool, device, sets)
        yield i, time_fn(fn, device, warmup=warmup, repeats=repeats)


def time_gemms(shapes: list[GemmShape], device, *, warmup: int, repeats: int, deadline: float | None = None,
               progress=None) -> tuple[list[tuple[int, int, int, float, str]], list[float], int]:
    """Times each shape; returns ((m, n, k, seconds, kind) points, relative spreads, shapes skipped by the
    deadline or beyond the memory pool)."""
    points, spreads = [], []
    for i, t in timed_gemms(shapes, device, warmup=warmup, repeats=repeats, deadline=deadline):
        if t is not None:
            s = shapes[i]
            points.append((s.m, s.n, s.k, t.median_s, s.kind))
            spreads.append(round(t.spread, 4))
        if progress:
            progress(1)
    return points, spreads, len(shapes) - len(points)


def sustained_gemm(device, size: int, seconds: float) -> dict:
    """One square GEMM timed as the grid times it (short batches behind a spin) and back to back for `seconds`
    (the last quarter timed with events): whether a GPU under sustained load runs GEMMs slower than in the
    grid's bursts (clocks, power). A diagnostic kept in extras; the cost model does not apply it. It explains
    GPU-paced steps running 6-10% slower than a burst-timed profile predicts while isolated layers do not."""
    device = torch.device(device)
    dtype = compute_dtype(device)
    a = [torch.randn(size, size, device=device, dtype=dtype) for _ in range(2)]
    b = [torch.randn(size, size, device=device, dtype=dtype) for _ in range(2)]
    burst = time_fn(lambda i: a[i % 2] @ b[i % 2], device, warmup=3, repeats=7)
    synchronize(device)
    calls, start = 0, time.perf_counter()
    marks = []
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            a[calls % 2] @ b[calls % 2]
            calls += 1
        if device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append((calls, ev))
            if len(marks) % 16 == 0:  # keep the queue short
                torch.cuda.synchronize(device)
        else:
            marks.append((calls, time.perf_counter()))
    synchronize(device)
    (c0, e0), (c1, e1) = marks[3 * len(marks) // 4], marks[-1]
    span = e0.elapsed_time(e1) / 1e3 if device.type == "cuda" else e1 - e0
    sustained = span / max(c1 - c0, 1)
    return {"m": size, "n": size, "k": size, "burst_s": burst.median_s, "sustained_s": sustained,
            "sustained_over_burst": sustained / burst.median_s, "seconds": seconds, "calls": calls}


# -- attention ---------------------------------------------------------------------------------------------

def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs of QK^T and PV, causal work halved (planner.profile.Profile.attention_s's convention)."""
    f = 4.0 * batch * heads * seq * seq * head_dim
    return f / 2 if causal else f


def time_attention(batch: int, heads: int, seq: int, head_dim: int, causal: bool, device, *, kv_heads: int = 0,
                   warmup: int = 2, repeats: int = 5) -> dict:
    """Forward and backward SDPA (the runtime's path), reported as achieved TFLOP/s with backward counted as
    2.5x the forward FLOPs. GQA (kv_heads < heads) goes through SDPA's enable_gqa."""
    device = torch.device(device)
    dtype = compute_dtype(device)
    kvh = kv_heads or heads
    sets = []
    for _ in range(2):
        q = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(batch, kvh, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        v = torch.randn(batch, kvh, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
        sets.append((q, k, v))
    gqa = kvh != heads

    def fwd(i):
        q, k, v = sets[i % 2]
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    # the full reheat before each: between cases the host draws new inputs (randn, a forward for the backward's
    # outputs), low-power GPU work that lets the clock climb; attention's timed window (~25 ms) is too short to
    # bring it back down (without the reheat, cases timed again without their first call's setup ran 8% faster)
    tf = time_fn(fwd, device, warmup=warmup, repeats=repeats, min_heat_s=REHEAT_MAX_S)
    outs = []
    for q, k, v in sets:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        outs.append((o, torch.randn_like(o), (q, k, v)))

    def bwd(i):
        o, g, inputs = outs[i % 2]
        return torch.autograd.grad(o, inputs, g, retain_graph=True)

    tb = time_fn(bwd, device, warmup=warmup, repeats=repeats, min_heat_s=REHEAT_MAX_S)
    flops = attention_flops(batch, heads, seq, head_dim, causal)
    outs.clear()   # free the graphs now (clear, not del: the closures above name these lists)
    sets.clear()
    return {"batch": batch, "heads": heads, "kv_heads": kvh, "seq": seq, "head_dim": head_dim, "causal": causal,
            "fwd_s": tf.median_s, "bwd_s": tb.median_s, "fwd_spread": round(tf.spread, 4),
            "bwd_spread": round(tb.spread, 4),
            "fwd_tflops": flops / tf.median_s / 1e12, "bwd_tflops": 2.5 * flops / tb.median_s / 1e12}


# -- memory-bound --------------------------------------------------------------------------------------------

def copy_bandwidth(device, numel: int) -> tuple[float, Timing]:
    """Device-to-device copy: bytes read + bytes written per second."""
    device = torch.device(device)
    x = [_randn(numel, device, torch.float32) for _ in range(2)]
    y = torch.empty_like(x[0])
    t = time_fn(lambda i: y.copy_(x[i % 2]), device, warmup=3, repeats=10)
    return 2.0 * numel * 4 / t.median_s, t


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _runtime_kernels():
    """The runtime's own SwiGLU (runtime/swiglu.py: keeps only its input; one Triton kernel each way on CUDA),
    rotary and residual norm (runtime/norm.py: the residual add fused into LayerNorm / RMSNorm, one Triton
    kernel each way on CUDA), when the runtime is importable; plain equivalents otherwise (recorded in the
    result)."""
    try:
        from runtime.norm import residual_norm
        from runtime.rotary import qkv_rotary
        from runtime.swiglu import swiglu
        return swiglu, qkv_rotary, residual_norm, \
            "runtime.swiglu.swiglu, runtime.rotary.qkv_rotary, runtime.norm.residual_norm"
    except Exception:  # noqa: BLE001 - the runtime may be mid-change; the stand-ins move the same bytes
        def swiglu(a):
            gate, up = a.chunk(2, dim=-1)
            return F.silu(gate) * up

        def rotary(qkv, cos, sin, heads, kv_heads):
            s_, b_, w_ = qkv.shape
            x = qkv.view(s_, b_, heads + 2 * kv_heads, -1)
            return x * cos.unsqueeze(1).unsqueeze(1).to(x.dtype) + _rotate_half(x) * sin.unsqueeze(1).unsqueeze(1).to(x.dtype)

        def residual_norm(x, delta, weight, bias, eps, rms):
            s = x if delta is None else x + delta
            return s, (F.rms_norm(s, (s.shape[-1],), weight, eps) if rms
                       else F.layer_norm(s, (s.shape[-1],), weight, bias, eps))
        return swiglu, rotary, residual_norm, "stand-ins (runtime not importable)"


def elementwise_kernels(device, tokens: int, hidden: int) -> tuple[dict[str, tuple], str]:
    """(name -> (fn(i), bytes the kernel must move at least), which implementation): the runtime's norms,
    activations (tanh GELU, SwiGLU), rotary and residual add, forward and backward, on [tokens, hidden]
    activations in the compute dtype (SwiGLU on [tokens, 2 hidden] -> [tokens, hidden]).

    Norms as a pre-norm layer runs them (runtime/model.py): `*norm_fwd` alone (the attention norm),
    `*norm_add_fwd` with the residual add before it (the MLP norm: reads x and the branch output, writes the
    sum and the normalised sum), and `*norm_bwd` with the residual's gradient merged in (reads the input,
    dy and the residual gradient, writes the input gradient; the weight / bias gradients come with it)."""
    device = torch.device(device)
    dtype = compute_dtype(device)
    es = torch.tensor([], dtype=dtype).element_size()
    N = tokens * hidden
    hd = 128 if hidden % 128 == 0 and hidden >= 128 else hidden
    swiglu, qkv_rotary, residual_norm, impl = _runtime_kernels()
    try:
        from runtime.bias_gelu import bias_gelu, bias_gelu_forward
        impl += ", runtime.bias_gelu"
    except Exception:  # noqa: BLE001 - as _runtime_kernels: a stand-in moving the same bytes
        def bias_gelu_forward(y, bias):
            return F.gelu(y + bias, approximate="tanh")
        bias_gelu = bias_gelu_forward
    mk = lambda cols=hidden: torch.randn(tokens, cols, device=device, dtype=dtype)  # noqa: E731
    x = [mk(), mk()]
    y = [mk(), mk()]
    xx = [mk(2 * hidden), mk(2 * hidden)]
    w = torch.randn(hidden, device=device, dtype=dtype)
    b = torch.randn(hidden, device=device, dtype=dtype)
    # rotary as the runtime applies it (runtime/rotary.py): the qkv GEMM output [seq, batch=1, (heads + 2 kv) d]
    # split into q, k, v [1, heads, seq, d] with q and k rotated, fp32 tables [seq, d]; a quarter of the width
    # for each of k and v (GQA)
    cos = torch.randn(tokens, hd, device=device)
    sin = torch.randn(tokens, hd, device=device)
    n_heads = hidden // hd
    kv_h = n_heads // 4 if n_heads >= 4 else 0   # narrow test widths: q only
    rot = lambda t: qkv_rotary(t.view(tokens, 1, hidden), cos, sin, n_heads - 2 * kv_h, kv_h)  # noqa: E731

    acc = [torch.zeros(tokens, hidden, device=device, dtype=torch.float32) for _ in range(2)]
    out: dict[str, tuple] = {
        "residual_add": (lambda i: x[i % 2] + y[i % 2], 3 * N * es),
        # a linear layer's bias gradient as runtime/parallel/tensor.py takes it: dY [tokens, out] summed over rows
        "bias_grad": (lambda i: x[i % 2].sum(0), N * es),
        # the data-parallel code's fp32 gradient accumulation: main_grad.add_(bf16 grad)
        "grad_accumulate": (lambda i: acc[i % 2].add_(x[i % 2]), N * (es + 8)),
        "layernorm_fwd": (lambda i: residual_norm(x[i % 2], None, w, b, 1e-5, False)[1], 2 * N * es),
        "rmsnorm_fwd": (lambda i: residual_norm(x[i % 2], None, w, None, 1e-5, True)[1], 2 * N * es),
        "layernorm_add_fwd": (lambda i: residual_norm(x[i % 2], y[i % 2], w, b, 1e-5, False), 4 * N * es),
        "rmsnorm_add_fwd": (lambda i: residual_norm(x[i % 2], y[i % 2], w, None, 1e-5, True), 4 * N * es),
        "gelu_fwd": (lambda i: F.gelu(x[i % 2], approximate="tanh"), 2 * N * es),
        # GPT / BERT's MLP: fc1's bias added inside the activation (runtime/bias_gelu.py)
        "bias_gelu_fwd": (lambda i: bias_gelu_forward(x[i % 2], b), 2 * N * es),
        "swiglu_fwd": (lambda i: swiglu(xx[i % 2]), 3 * N * es),
        "rotary_fwd": (lambda i: rot(x[i % 2]), 2 * N * es),
    }
    # backward: autograd through the same functions, graphs kept; the norms' weight (and bias) gradients
    # are computed as in training
    xs = [t.detach().clone().requires_grad_(True) for t in x]
    wg, bg = w.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    xxs = [t.detach().clone().requires_grad_(True) for t in xx]
    graphs = {
        "layernorm_bwd": ([residual_norm(xs[j], None, wg, bg, 1e-5, False) for j in range(2)], 4 * N * es,
                          lambda j: (xs[j], wg, bg)),
        "rmsnorm_bwd": ([residual_norm(xs[j], None, wg, None, 1e-5, True) for j in range(2)], 4 * N * es,
                        lambda j: (xs[j], wg)),
        "gelu_bwd": ([F.gelu(xs[j], approximate="tanh") for j in range(2)], 3 * N * es, lambda j: (xs[j],)),
        # with the bias's gradient (column partial sums, then their sum) in the same backward
        "bias_gelu_bwd": ([bias_gelu(xs[j], bg) for j in range(2)], 3 * N * es, lambda j: (xs[j], bg)),
        "swiglu_bwd": ([swiglu(xxs[j]) for j in range(2)], 5 * N * es, lambda j: (xxs[j],)),
        "rotary_bwd": ([rot(xs[j]) for j in range(2)], 2 * N * es, lambda j: (xs[j],)),
    }
    for name, (outs, nbytes, inputs) in graphs.items():
        outs = [o if isinstance(o, tuple) else (o,) for o in outs]   # the norms: (residual, normalised)
        grads = [tuple(torch.randn_like(t) for t in o) for o in outs]

        def fn(i, outs=outs, inputs=inputs, grads=grads):
            j = i % 2
            return torch.autograd.grad(outs[j], inputs(j), grads[j], retain_graph=True)
        out[name] = (fn, nbytes)
    return out, impl


def time_elementwise(device, tokens: int, hidden: int, copy_bw: float) -> dict[str, dict]:
    res = {}
    kernels, impl = elementwise_kernels(device, tokens, hidden)
    for name, (fn, nbytes) in kernels.items():
        t = time_fn(fn, device, warmup=3, repeats=7)
        res[name] = {"seconds": t.median_s, "bytes": nbytes, "fraction_of_copy": nbytes / t.median_s / copy_bw,
                     "spread": round(t.spread, 4), "implementation": impl}
    return res


def elementwise_efficiency(results: dict[str, dict], copy_bw: float) -> float:
    """One fraction for the cost model: total bytes over total time, relative to the copy bandwidth (so that
    summing predicted times over this mix reproduces the measured sum)."""
    total_b = sum(r["bytes"] for r in results.values())
    total_t = sum(r["seconds"] for r in results.values())
    return max(1e-3, min(1.0, total_b / total_t / copy_bw))


def time_embedding_and_loss(device, tokens: int, hidden: int, vocab: int, copy_bw: float) -> dict[str, dict]:
    """Embedding lookup (forward) and cross-entropy over [tokens, vocab] logits (forward + backward), as
    fractions of the copy bandwidth (recorded in extras; the cost model prices them as memory-bound, with the
    same nominal byte counts: 2 x element size per embedding value and per logit)."""
    from runtime.parallel.cross_entropy import vocab_parallel_cross_entropy
    device = torch.device(device)
    dtype = compute_dtype(device)
    es = torch.tensor([], dtype=dtype).element_size()
    table = torch.randn(vocab, hidden, device=device, dtype=dtype)
    ids = [torch.randint(0, vocab, (tokens,), device=device) for _ in range(2)]
    logits = [torch.randn(tokens, vocab, device=device, dtype=dtype, requires_grad=True) for _ in range(2)]
    labels = [torch.randint(0, vocab, (tokens,), device=device) for _ in range(2)]
    res = {}
    t = time_fn(lambda i: F.embedding(ids[i % 2], table), device, warmup=3, repeats=7)
    nb = 2 * tokens * hidden * es
    res["embedding_fwd"] = {"seconds": t.median_s, "bytes": nb, "fraction_of_copy": nb / t.median_s / copy_bw}

    def ce(i):  # the runtime's own loss (runtime/parallel/cross_entropy.py), one rank's vocabulary
        lg = logits[i % 2]
        loss = vocab_parallel_cross_entropy(lg, labels[i % 2], None).sum()
        return torch.autograd.grad(loss, (lg,))

    t = time_fn(ce, device, warmup=2, repeats=5)
    nb = 2 * tokens * vocab * es   # read logits, write their gradient
    res["cross_entropy_fwd_bwd"] = {"seconds": t.median_s, "bytes": nb, "fraction_of_copy": nb / t.median_s / copy_bw}
    return res


# -- optimizer, launch overhead --------------------------------------------------------------------------------

def optimizer_step_s_per_param(device, numel: int, segments: int = 4) -> tuple[float, str]:
    """The runtime's AdamW step (runtime/parallel/adamw.py: fp32 master, gradient, m, v and the compute-dtype
    weights written in the same pass, gradients divided by a clip factor) per parameter, over `segments`
    contiguous pieces of flat buffers as the distributed optimizer calls it (about two per 40M-element
    bucket: many small pieces would time the kernel launches instead)."""
    from runtime.parallel.adamw import Segment, adamw_
    from runtime.triton_support import use_triton

    device = torch.device(device)
    numel = numel // segments * segments
    flat = {k: torch.randn(numel, device=device) for k in ("master", "grad", "m")}
    flat["v"] = torch.rand(numel, device=device)
    param = flat["master"].to(compute_dtype(device))
    per = numel // segments
    segs = [Segment(*(flat[k][i * per:(i + 1) * per] for k in ("master", "grad", "m", "v")),
                    param[i * per:(i + 1) * per], i % 2 == 0) for i in range(segments)]
    divisor = torch.tensor(1.5, device=device)
    step_t = torch.zeros((), device=device)
    t = time_fn(lambda i: adamw_(segs, 1 + i % 100, 1e-4, (0.9, 0.95), 1e-8, 0.1, divisor, step_t), device,
                warmup=3, repeats=7, max_inner=4)
    impl = "triton (runtime/parallel/adamw.py)" if use_triton(device) else "torch._fused_adamw_ + copy"
    return t.median_s / numel, impl


def launch_overhead_s(device, calls: int = 300) -> float:
    """Host time per small eager op (dispatch + launch), when the GPU is not the bottleneck."""
    device = torch.device(device)
    x = torch.randn(16, device=device)
    for _ in range(20):
        x.add_(1e-3)
    synchronize(device)
    t = time.perf_counter()
    for _ in range(calls):
        x.add_(1e-3)
    synchronize(device)
    return (time.perf_counter() - t) / calls
