"""One timer for every kernel the profiler measures.

On CUDA: warm-up calls, then `repeats` batches, each between two CUDA events, of `inner` back-to-back
calls (inner grows for short kernels so the event overhead does not count). Before each batch a spin
kernel (`torch.cuda._sleep`) holds the GPU while the host enqueues the batch, so what is timed is the
kernels' device time, not the host's launch rate (launch overhead is measured separately, see
`kernels.launch_overhead_s`). The spin lasts twice the host's measured enqueue time per call; a batch whose
enqueue outlasted its spin is timed once more behind a longer one. On CPU: time.perf_counter around the same batches.

Callers pass `fn(i)` where i counts calls, so they can rotate through several input sets (caches must not
flatter the result; see kernels.RandomPool). The answer is the median over batches, with the spread recorded.

Power: a GPU under sustained tensor load runs at its power cap, at a lower SM clock than in short bursts
(an H200 at 700 W: 1980 MHz in the first ~0.1 s, then 1485-1665 MHz; big bf16 GEMMs 9-23% slower, whole layers
14-16%, a copy not at all). Training is sustained, so the profiler times every kernel at
that operating point: inside `at_power_cap(device)` a heater (bf16 GEMMs, `PowerHeater`) runs before each
kernel and before each timed batch, in place of the spin, and keeps the GPU at its cap. Without it a grid's
big shapes are timed throttled and its small ones at boost, depending on what ran just before. It does not
hold every kernel at one clock: runtime/profiler/README.md, "Timing at the power cap", says how far it gets.
"""
from __future__ import annotations

import contextlib
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


HEAT_FIRST_S = 1.0
"""Heat from cold: the clock reaches its capped level within 0.06-0.15 s of sustained GEMMs (H200)."""
HEAT_BEFORE_S = 4e-3
"""Heat before each kernel's warm-up, when the previous kernel was timed just before."""
REHEAT_AFTER_IDLE_S = 5e-3
"""A GPU left idle longer than this (the host preparing the next kernel's inputs) has its clock back towards
boost within ~20 ms; it is heated again for REHEAT_PER_IDLE x the idle time, at most REHEAT_MAX_S (the
clock falls to its capped level within 0.06-0.15 s of sustained load). Heated only HEAT_BEFORE_S, a profile times
its attention grid at 1840-1980 MHz where its GEMM grid runs at 1410-1500."""
REHEAT_PER_IDLE = 5.0
REHEAT_MAX_S = 0.15
HEAT_PER_BATCH_S = 4e-4
"""Heat before each timed batch (at least the spin's length): keeps the duty cycle, and so the power, high
while short kernels are timed."""


class PowerHeater:
    """bf16 GEMMs [2048, 8192] x [8192, 8192] (0.27 TFLOP, ~0.4 ms on an H200) queued to keep the GPU at the
    operating point sustained training holds it at (see the module doc)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.a = torch.randn(2048, 8192, device=device, dtype=torch.bfloat16)
        self.b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        self.out = torch.empty(2048, 8192, device=device, dtype=torch.bfloat16)
        for _ in range(3):
            self._call()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            self._call()
        e.record()
        e.synchronize()
        # at boost: under the cap a call takes longer, so the heat queued is at least what was asked for
        self.call_s = max(s.elapsed_time(e) / 1e3 / 10, 1e-5)
        self.idle_since = time.perf_counter()
        """When the GPU last ran out of work the heater knows of (time_fn's final synchronisation)."""

    def heat_before_kernel(self, busy_s: float = 0.0, min_s: float = 0.0) -> None:
        """HEAT_BEFORE_S, or longer after the GPU has idled (REHEAT_AFTER_IDLE_S) since the last timed kernel,
        less `busy_s` of GPU work run in between (the kernel's own warm-up calls); at least min_s."""
        idle_s = time.perf_counter() - self.idle_since - busy_s
        heat_s = HEAT_BEFORE_S if idle_s < REHEAT_AFTER_IDLE_S else min(REHEAT_MAX_S, HEAT_BEFORE_S + REHEAT_PER_IDLE * idle_s)
        self.run(max(heat_s, min_s))

    def _call(self) -> None:
        torch.mm(self.a, self.b, out=self.out)

    def run(self, seconds: float) -> None:
        """Queue about `seconds` of heater GEMMs on the current stream (returns at once)."""
        for _ in range(max(1, math.ceil(seconds / self.call_s))):
            self._call()


_HEATERS: dict[int, PowerHeater] = {}


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def active_heater(device: torch.device) -> PowerHeater | None:
    device = torch.device(device)
    return _HEATERS.get(_device_index(device)) if device.type == "cuda" else None


@contextlib.contextmanager
def at_power_cap(device, enabled: bool = True):
    """Kernels timed inside are timed with the GPU held at its power cap (module doc); a no-op on CPU, when
    not enabled, or inside another at_power_cap for the same device. Yields the heater or None."""
    device = torch.device(device)
    if device.type != "cuda" or not enabled or active_heater(device) is not None:
        yield active_heater(device)
        return
    heater = PowerHeater(device)
    heater.run(HEAT_FIRST_S)
    _HEATERS[_device_index(device)] = heater
    try:
        yield heater
    finally:
        _HEATERS.pop(_device_index(device), None)


def back_to_back_s(fn, seconds: float, sync_every: int = 8) -> float:
    """Median per-call device time of fn() called back to back for `seconds` (CUDA), over the second half of the
    calls: the clock under sustained load, as in training, after it has settled (the first ~0.15 s run at boost).
    Waits every `sync_every` calls so that the wall clock tracks the GPU's."""
    torch.cuda.synchronize()
    events, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        events.append((a, b))
        if len(events) % sync_every == 0:
            b.synchronize()
    torch.cuda.synchronize()
    return _median([a.elapsed_time(b) / 1e3 for a, b in events[len(events) // 2:]])


def power_state_under_heat(device) -> dict | None:
    """The GPU's clock and power (environment.gpu_power_state) read while 0.3 s of heat runs: the operating
    point the kernels inside at_power_cap were timed at. None outside at_power_cap or without nvidia-smi."""
    from runtime.profiler.environment import gpu_power_state

    device = torch.device(device)
    heater = active_heater(device)
    if heater is None:
        return None
    heater.run(0.3)
    time.sleep(0.15)  # read in the second half of the heat, after the clock has settled
    state = gpu_power_state(device)
    torch.cuda.synchronize(device)
    return state


def time_fn(fn, device: torch.device, *, warmup: int = 3, repeats: int = 10, target_batch_s: float = 2e-4,
            max_inner: int = 64, min_heat_s: float = 0.0) -> Timing:
    """Median per-call time of fn(i) (see module doc). min_heat_s: heat at least this long before the timed
    batches, whatever ran before (for kernels whose callers run low-power work between them)."""
    device = torch.device(device)
    heater = active_heater(device)
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
    # heat after the warm-up, right before the timed batches: a kernel's first calls can keep the host busy
    # for tenths of a second (cuDNN builds its attention graphs per shape) while the GPU idles back to boost.
    # Heated before the warm-up instead, a profile timed its first pass of attention cases at 1980 MHz and the
    # next two at 1600-1700 MHz, 13% slower
    if heater is not None:  # the warm-up's own GPU time is not idle (q2 counted it: 58 against 36 ms a GEMM)
        heater.heat_before_kernel(busy_s=calls * est, min_s=min_heat_s)
    times: list[float] = []
    if device.type == "cuda":
        events = []
        for _ in range(repeats):
            # hold the GPU while the host enqueues the batch: twice the measured host cost per call (a fixed
            # 15 us per call lets the FP8 path's quantisation launches and the wgrad calls run dry, timing
            # the host's pace: small FP8 GEMMs then read 270-320 us)
            spin_s = inner * max(15e-6, 2.0 * host_call_s) + 20e-6
            for _ in range(2):  # a second attempt only if the enqueue outlasted the spin
                if heater is not None:
                    heater.run(max(spin_s, HEAT_PER_BATCH_S))
                else:
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
        if heater is not None:
            heater.idle_since = time.perf_counter()
        times = [s.elapsed_time(e) / 1e3 / inner for s, e in events]
    else:
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(inner):
                fn(calls)
                calls += 1
            times.append((time.perf_counter() - t) / inner)
    return Timing(median_s=_median(times), min_s=min(times), max_s=max(times), repeats=repeats, inner=inner)
