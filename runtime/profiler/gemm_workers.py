"""The GEMM grid timed on every device of the node at once: one spawned process per device, process r timing
the interleaved share shapes[r::n] of the ordered grid.

The grid is the profile's largest stage and takes what remains of the time budget; on one GPU a full profile
reached 4378 of ~9700 shapes. GPUs of one node are identical, so timing shape i on device i mod n is as good
as timing it on GPU 0, and since the grid is ordered coarse to fine, an interleaved split keeps the budget's
cut even across devices (every share is cut at about the same place in the order). No process group is
needed: the workers share nothing but a progress queue, and each writes its points, tagged with their index
in the grid, as JSON for the parent to merge back into the grid's order.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from planner.errors import PlanError
from runtime.profiler import kernels
from runtime.profiler.shapes import GemmShape
from runtime.profiler.timing import at_power_cap

GRACE_S = 120.0
"""Seconds past the deadline before the parent gives up on the workers: process start-up (import torch, CUDA
context, the operand pool) and the last shape begun before the deadline both run past it."""


def time_gemms_parallel(shapes: list[GemmShape], devices: list, *, warmup: int, repeats: int,
                        deadline: float | None, progress=None, at_power_cap: bool = True
                        ) -> tuple[list[tuple[int, int, int, float, str]], list[float], int]:
    """kernels.time_gemms over `devices` (one process each; the same device may repeat, e.g. 'cpu' for
    processes on CPU): (points in the grid's order, spreads aligned with them, shapes not timed). One device
    times in this process; `deadline` is time.monotonic() here, as for time_gemms. at_power_cap: each worker
    times its share with its GPU held at the power cap (timing.at_power_cap; this process's caller holds its own)."""
    if len(devices) <= 1 or not shapes:
        device = devices[0] if devices else "cpu"
        return kernels.time_gemms(shapes, device, warmup=warmup, repeats=repeats, deadline=deadline,
                                  progress=progress)
    names = [str(d) for d in devices]
    job = {**_job(shapes, warmup, repeats, deadline), "at_power_cap": at_power_cap}
    rows = _spawn_and_wait(job, names, deadline, progress)
    rows.sort(key=lambda r: r[0])
    points = [(m, n, k, t, kind) for _, m, n, k, t, kind, _ in rows]
    spreads = [sp for *_, sp in rows]
    return points, spreads, len(shapes) - len(points)


def _job(shapes: list[GemmShape], warmup: int, repeats: int, deadline: float | None) -> dict:
    """What every worker gets, as plain data. time.monotonic() has no common origin across processes, so the
    deadline travels as wall-clock time (time.time()); each worker turns it back into its own monotonic
    clock, which also charges the workers' start-up to the budget."""
    deadline_epoch_s = None if deadline is None else time.time() + (deadline - time.monotonic())
    return {"shapes": [[s.m, s.n, s.k, s.kind] for s in shapes], "warmup": warmup, "repeats": repeats,
            "deadline_epoch_s": deadline_epoch_s}


# -- the worker (runs in each spawned process) -------------------------------------------------------------

def _worker(rank: int, devices: list[str], job: dict, out_dir: str, queue) -> None:
    """Times shapes[rank::n] on devices[rank]; writes [[grid index, m, n, k, seconds, kind, spread], ...]."""
    import torch

    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)   # one thread per process: oversubscribed OpenMP stalls for ~10 ms at a time
    n = len(devices)
    share = [GemmShape(m, nn, k, kind) for m, nn, k, kind in job["shapes"][rank::n]]
    epoch = job["deadline_epoch_s"]
    deadline = None if epoch is None else time.monotonic() + (epoch - time.time())
    rows = []
    with at_power_cap(device, job.get("at_power_cap", True)):
        for j, t in kernels.timed_gemms(share, device, warmup=job["warmup"], repeats=job["repeats"],
                                        deadline=deadline):
            if t is not None:
                s = share[j]
                rows.append([rank + j * n, s.m, s.n, s.k, t.median_s, s.kind, round(t.spread, 4)])
            queue.put(1)
    Path(out_dir, f"gemm-{rank}.json").write_text(json.dumps(rows))


# -- the parent ------------------------------------------------------------------------------------------------

def _spawn_and_wait(job: dict, devices: list[str], deadline: float | None, progress) -> list[list]:
    """Runs the workers, forwarding their progress; their merged rows (unsorted). A worker that raises or
    dies, or workers still running GRACE_S past the deadline, end in one PlanError sentence."""
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    limit = None if deadline is None else deadline + GRACE_S
    with tempfile.TemporaryDirectory() as tmp:
        pc = mp.start_processes(_worker, args=(devices, job, tmp, queue), nprocs=len(devices), join=False,
                                start_method="spawn")
        try:
            while not _join(pc, devices):
                _forward(queue, progress)
                if limit is not None and time.monotonic() > limit:
                    raise PlanError(f"GEMM timing on {len(devices)} devices did not finish within {GRACE_S:.0f} s "
                                    "of its time budget; the workers were stopped")
            _forward(queue, progress)
        finally:
            for p in pc.processes:
                if p.is_alive():
                    p.terminate()
        return [row for r in range(len(devices)) for row in json.loads(Path(tmp, f"gemm-{r}.json").read_text())]


def _join(pc, devices: list[str]) -> bool:
    """pc.join for 0.2 s: True when all workers have finished; a failed worker becomes a PlanError naming its
    device and the error's last line (torch has already stopped the other workers)."""
    import torch.multiprocessing as mp

    try:
        return pc.join(timeout=0.2)
    except mp.ProcessRaisedException as exc:
        raise PlanError(f"GEMM timing failed in the worker on {_device_of(exc, devices)}: "
                        f"{_last_line(str(exc))}") from None
    except mp.ProcessExitedException as exc:
        how = f"signal {exc.signal_name}" if exc.signal_name else f"exit code {exc.exit_code}"
        raise PlanError(f"the GEMM timing worker on {_device_of(exc, devices)} died ({how})") from None


def _device_of(exc, devices: list[str]) -> str:
    i = exc.error_index
    return f"{devices[i]} (process {i})" if devices.count(devices[i]) > 1 else devices[i]


def _last_line(trace: str, max_chars: int = 300) -> str:
    """The exception line at the end of a worker's traceback (its type and message), shortened."""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else "unknown error"
    return line if len(line) <= max_chars else line[:max_chars] + "..."


def _forward(queue, progress) -> None:
    while not queue.empty():
        n = queue.get()
        if progress:
            progress(n)
