"""A whole training step as one CUDA graph (Layout.cuda_graph): the host issues one launch per step.

Without it the host issues every kernel of the step itself, about 50 per layer, and for small layers or
TP > 1 it issues them more slowly than the GPU runs them: the step is host-paced, slower than its GPU time
and as variable as the host. A graph captured once and replayed
every step takes the host out: the step runs at the GPU's pace.

What a replay needs, and where it comes from:
- inputs at fixed addresses: each step's micro-batches are copied into the buffers the capture read;
- the step's AdamW scalars (learning rate, bias corrections) in device memory: `opt.prepare_step(lr)` before
  each replay writes them where the captured update kernel reads them (runtime/parallel/adamw.py);
- no host synchronisation inside the step: legality allows graphs only where the step has none (no expert
  parallelism, MoE only with grouped GEMMs, sharding below 'full'; planner/legality.py). A pipeline step captures its whole schedule, point-to-point
  transfers included; it records no action timeline while capturing, so a replayed step's bubble is not
  measured;
- ZeRO's parameter all-gathers, which the eager step launches after the update and the next forward waits
  for, move to the start of the replay (the shards the previous replay updated), still overlapped with the
  forward by the same pre-hooks; `sync_params()` gathers the last update before a checkpoint or the end.

Warm-up: the first WARMUP_STEPS steps run eagerly (they are real training steps): they initialise the NCCL
communicators, cuBLAS workspaces and Triton kernels, none of which may happen during capture. The capture
then runs the step's Python once with the GPU recording instead of executing; the first replay executes it.
The allocator gives the graph a private memory pool; the eager steps' cached blocks are released first so
the two do not both hold an activation peak. The capture's peak allocation is the replayed step's peak.
"""
from __future__ import annotations

import gc

import torch

from planner.errors import PlanError

WARMUP_STEPS = 2
"""Eager steps before the capture (NCCL communicators and Triton kernels must exist before capturing)."""

CAPTURE_ERROR_MODE = "thread_local"
"""What the capture forbids: unsafe CUDA calls (synchronisation, event queries, allocations outside the graph's
pool) from the capturing thread only. The data Prefetcher (runtime/data.py) pins the next steps' batches in its own
thread while the step is captured; pinning may allocate page-locked memory and query the events of earlier copies,
which in torch's default 'global' mode invalidates the capture under way ("operation failed due to a previous
error during capture" at the step's first kernel): BERT-large's masked-LM batches take long enough to make that the
thread can still be pinning when the capture begins (tests/runtime/test_graph.py forces the overlap)."""

_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream() -> torch.cuda.Stream:
    """One warm-up/capture stream per device for the whole process. cuBLAS keeps a 32 MiB workspace per stream
    that ran a GEMM, for the life of the process: a new stream per GraphedStep would leak two of them per plan
    when `plan validate` runs plans back to back, and in a 100-plan sweep later plans would peak up to 2 GiB
    above the same plan run alone."""
    dev = torch.cuda.current_device()
    if dev not in _SIDE_STREAMS:
        _SIDE_STREAMS[dev] = torch.cuda.Stream()
    return _SIDE_STREAMS[dev]


class GraphedStep:
    """Drop-in for `train_step(stages, micro_batches, opt, groups, lr, before_step)` (runtime.step or the
    pipeline's) on CUDA."""

    def __init__(self, step_fn, opt):
        self.step_fn, self.opt = step_fn, opt
        self.eager_left = WARMUP_STEPS
        self.stream: torch.cuda.Stream | None = None
        """The side stream of the warm-up steps and of the capture (_on_capture_stream)."""
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_mbs: list[dict] | None = None
        self.outputs = None
        self.peak_mem_gib = 0.0
        """Peak allocated memory during the capture: what a replay of the step holds at its peak."""

    @property
    def replaying(self) -> bool:
        return self.graph is not None

    def __call__(self, stages, micro_batches, opt, groups, lr=None, before_step=None):
        if self.graph is None and self.eager_left > 0:
            self.eager_left -= 1
            return self._on_capture_stream(lambda: self.step_fn(stages, micro_batches, opt, groups, lr, before_step),
                                           micro_batches)
        if self.graph is None:
            self._capture(stages, micro_batches, groups)
        for static, mb in zip(self.static_mbs, micro_batches):
            for k, v in mb.items():
                static[k].copy_(v, non_blocking=True)
        self.opt.prepare_step(lr)
        self.graph.replay()
        return self.outputs

    def _on_capture_stream(self, fn, micro_batches):
        """Run an eager warm-up step on the stream the capture will use. Autograd runs a parameter's gradient
        accumulation on the stream where its AccumulateGrad node was made, and those nodes outlive a step
        (the optimizer's hooks hold them): made on the default stream, they make the captured backward wait
        on the legacy stream, and capture fails (as it does for the MoE layer). PyTorch's recipe: warm up on a
        side stream."""
        if self.stream is None:
            self.stream = side_stream()
        here = torch.cuda.current_stream()
        self.stream.wait_stream(here)  # the micro-batches' copies and the previous step
        for mb in micro_batches:       # made on `here`, read on the side stream: keep them until it is done
            for v in mb.values():
                v.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            out = fn()
        here.wait_stream(self.stream)
        return out

    def _capture(self, stages, micro_batches, groups):
        opt = self.opt
        torch.cuda.synchronize()
        opt.wait_params()  # the last eager step's all-gathers: nothing may be in flight across the capture
        self.static_mbs = [{k: v.clone() for k, v in mb.items()} for mb in micro_batches]
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.graph = torch.cuda.CUDAGraph()
        opt.captured = True
        try:
            with torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode=CAPTURE_ERROR_MODE):
                opt.gather_params()  # the previous step's update; the forward's pre-hooks wait for each bucket
                self.outputs = self.step_fn(stages, self.static_mbs, opt, groups, None, None)
                opt.wait_params()  # every side stream joins the capture before it ends
        except RuntimeError as exc:  # torch's CUDA errors are RuntimeErrors; the worker prints one sentence
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PlanError(f"capturing the training step as a CUDA graph failed ({first}); plan again with "
                            "--no-cuda-graph, or set \"cuda_graph\": false in the plan's layout") from exc
        finally:
            opt.captured = False
        torch.cuda.synchronize()
        self.peak_mem_gib = torch.cuda.max_memory_allocated() / 2**30

    def sync_params(self) -> None:
        """All-gather the last replay's update (ZeRO) so every rank's compute-dtype weights are current."""
        if self.graph is not None:
            self.opt.gather_params()
            self.opt.wait_params()
