"""The step part of the trainer: the next step's micro-batches through the step function, queued on the device
with its timing marks and read back later (`StepLog.record`); --trace-step and --memory-step run a step alone."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from runtime.trainer.build import Trainer


class StepClock:
    """Marks on the GPU's stream (CUDA events, no synchronisation) or the host's wall clock (CPU)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        """Between two marks; on CUDA only once b has completed."""
        if a is None or b is None:
            return 0.0
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


@dataclass
class LaunchedStep:
    """A step whose work is queued on the GPU; read back (`StepLog.record`) once the next one is queued too.
    step_s runs from `start` to `end`: the previous step's end when this step was queued behind it, else a
    mark made as the host began this step; GPU time idle waiting for the host counts either way."""
    step: int
    loss_and_norm: torch.Tensor
    """[loss, grad norm] in (pinned) host memory, valid once `end` has completed."""
    peak_mem_gib: float
    data_wait_s: float
    lr: float
    start: object
    optimizer_start: object
    end: object
    replayed: bool = False
    """Run as a CUDA-graph replay (no optimizer mark, no pipeline timeline)."""


def _traced(args, cuda: bool, fn):
    """One step under torch.profiler; rank 0 writes the ops by device time and (one process, or CPU) by host
    time. With several GPU processes only the device is traced: the host profiler's per-op cost slows a
    host-paced step about twenty-fold (a TP2 step from 0.2 s to 3.9 s), and its NCCL kernels then wait on the
    slow peer, which makes the exposed-communication figure meaningless."""
    from torch.profiler import ProfilerActivity, profile

    host = not cuda or dist.get_world_size() == 1
    acts = ([ProfilerActivity.CPU] if host else []) + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        out = fn()
        if cuda:
            torch.cuda.synchronize()
    if dist.get_rank() == 0 and args.trace_out:
        ka = prof.key_averages()
        with open(args.trace_out, "w") as fh:
            if cuda:
                fh.write(ka.table(sort_by="self_cuda_time_total", row_limit=60, max_name_column_width=90) + "\n")
            if host:
                fh.write(ka.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
            if cuda:
                from runtime.trace_analysis import exposed_communication, kernels_of
                x = exposed_communication(kernels_of(prof))
                span = x["span"] or 1.0
                fh.write(f"GPU timeline of the traced step (rank 0): span {1e3 * x['span']:.2f} ms, busy "
                         f"{1e3 * x['busy']:.2f} ms, compute kernels {1e3 * x['compute']:.2f} ms, communication "
                         f"kernels {1e3 * x['communication']:.2f} ms, exposed communication "
                         f"{1e3 * x['exposed_communication']:.2f} ms ({100 * x['exposed_communication'] / span:.1f}% "
                         "of the span)\n")
    return out


def launch_step(t: Trainer, step: int, profiled: bool, memory: bool, queued_behind) -> LaunchedStep:
    """The step part of the trainer: queue step `step` (0-based) on the device and return it unread.

    Args:
        t: the trainer.
        step: the step's index; the learning rate is the schedule's at it.
        profiled: run it under torch.profiler (--trace-step).
        memory: record the CUDA allocator during it (--memory-step).
        queued_behind: the end mark of the step queued just before this one (not read back yet), or None. The
            step's time runs from there, so GPU time idle between the two steps counts; else from a mark made as
            the host begins this step.
    """
    args, cuda, clock = t.args, t.cuda, t.clock
    start_mark = clock.mark()
    mbs, wait = t.prefetch.next()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    lr = t.settings.schedule.at(step)
    opt_marks = []

    def run():
        return t.step_fn(t.stages, mbs, t.opt, t.groups, lr, before_step=lambda: opt_marks.append(clock.mark()))

    if memory:
        from runtime import memory_trace
        spec, lay = t.plan.model, t.plan.layout
        (loss, norm), summary = memory_trace.record_step(run, t.local_rank)
        memory_trace.write(summary, args.memory_out, dist.get_rank(),
                           {"model": spec.name, "layout": lay.short(), "micro_batch": lay.micro_batch,
                            "step": step + 1, "rank": dist.get_rank(), "commit": os.environ.get("PLAN_COMMIT", "")})
    elif profiled:
        loss, norm = _traced(args, cuda, run)
    else:
        loss, norm = run()
    # loss and norm go to pinned host memory behind this step's kernels: reading a device tensor later
    # (.item()) would queue behind the next step's kernels too and wait for them
    numbers = torch.empty(2, pin_memory=cuda)
    numbers.copy_(torch.stack([loss.detach().float(), norm.detach().float()]), non_blocking=True)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    replayed = t.graphed is not None and t.graphed.replaying
    if replayed:  # a replay allocates nothing; its capture held the peak
        peak_gib = max(peak_gib, t.graphed.peak_mem_gib)
    return LaunchedStep(step + 1, numbers, peak_gib, wait, lr,
                        queued_behind if queued_behind is not None else start_mark,
                        opt_marks[0] if opt_marks else None, clock.mark(), replayed=replayed)
