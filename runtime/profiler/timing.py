"""One timer for every kernel the profiler measures.

On CUDA: warm-up calls, then `repeats` batches, each between two CUDA events, of `inner` back-to-back
calls (inner grows for short kernels so the event overhead does not count). Before each batch a spin
kernel (`torch.cuda._sleep`) holds the GPU while the host enqueues the batch, so what is timed is the
kernels' device time, not the host's launch rate (launch overhead is measured separately, see
`kernels.launch_overhead_s`). The spin lasts twice the host's measured enqueue time per call; a batch whose
enqueue outlasted its spin is timed once more behind a longer one. On CPU: time.perf_counter around the same batches.

Callers pass `fn(i)` where i counts calls, so they can rotate through several input sets (caches must not
flatter the result; see kernels.RandomPool). The answer is the median over batches, with the spread recorded.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    repeats: int
    inner: int

    @property
    def spread(self) -> float:
        """(max - min) / median over the repeats."""
        return (self.max_s - self.min_s) / self.median_s if self.median_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"median_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s, "repeats": self.repeats,
                "inner": self.inner}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


_MAX_SPIN_S = 0.05


def hold_gpu(device: torch.device, seconds: float) -> None:
    """Keep the GPU busy for about `seconds` so the host can queue the timed batch behind it."""
    if device.type != "cuda" or not hasattr(torch.cuda, "_sleep"):
        return
    # _sleep counts SM clock cycles; 2 GHz over-estimates the H100/H200 clock (1.98 GHz boost): longer is safe
    torch.cuda._sleep(int(min(seconds, _MAX_SPIN_S) * 2.0e9))


def time_fn(fn, device: torch.device, *, warmup: int = 3, repeats: int = 10, target_batch_s: float = 2e-4,
            max_inner: int = 64) -> Timing:
    """Median per-call time of fn(i) (see module doc)."""
    device = torch.device(device)
    calls = 0
    # warm-up; the last warm-up calls also give a first estimate of the per-call time
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn(calls)
        calls += 1
    synchronize(device)
    est = (time.perf_counter() - t0) / max(warmup, 1)
    host_call_s = 0.0
    if device.type == "cuda":
        # host time over-estimates short kernels (launch bound); refine with one event-timed call, whose
        # enqueue also gives the host's cost per call
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        s.record()
        fn(calls)
        calls += 1
        e.record()
        host_call_s = time.perf_counter() - t
        e.synchronize()
        est = max(s.elapsed_time(e) / 1e3, 1e-7)
    inner = int(min(max_inner, max(1, math.ceil(target_batch_s / max(est, 1e-9)))))
    times: list[float] = []
    if device.type == "cuda":
        events = []
        for _ in range(repeats):
            # hold the GPU while the host enqueues the batch: twice the measured host cost per call (a fixed
            # 15 us per call let the FP8 path's quantisation launches and the wgrad calls run dry, timing
            # the host's pace: session 6 measured small FP8 GEMMs at 270-320 us)
            spin_s = inner * max(15e-6, 2.0 * host_call_s) + 20e-6
            for _ in range(2):  # a second attempt only if the enqueue outlasted the spin
                hold_gpu(device, spin_s)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t = time.perf_counter()
                s.record()
                for _ in range(inner):
                    fn(calls)
                    calls += 1
                e.record()
                enqueue_s = time.perf_counter() - t
                if enqueue_s < spin_s or spin_s >= _MAX_SPIN_S:
                    break
                spin_s = min(2.0 * enqueue_s, _MAX_SPIN_S)  # the GPU may have run dry: once more, longer
            events.append((s, e))
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 / inner for s, e in events]
    else:
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(inner):
                fn(calls)
                calls += 1
            times.append((time.perf_counter() - t) / inner)
    return Timing(median_s=_median(times), min_s=min(times), max_s=max(times), repeats=repeats, inner=inner)
