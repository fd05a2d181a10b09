"""Collective timings through torch.distributed, in processes this module spawns (NCCL on GPUs, gloo on CPU).

For every group size the machine allows (powers of two from 2 to the number of processes) it times
all_reduce, all_gather_into_tensor (all_gather_single from torch 2.13), reduce_scatter_tensor
(reduce_scatter_single) and all_to_all_single, and send/recv between two
ranks, over message sizes from 4 KiB to 1 GiB. Sizes follow nccl-tests (and planner.profile.bus_factor):
bytes = the full buffer (all-gather output, reduce-scatter input). Each time is the median over repeats of
a batch of back-to-back calls (batches grow for short messages) timed from the end of one untimed call that
absorbs the ranks' skew, the slowest rank's. The fits are made
with planner.profile.fit_collective over 1 MiB and up (the messages training sends), the points below kept.

NVLink multicast (NVLS) stays off in every spawned process: NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (FORCED_ENV, recorded in the profile's provenance as environment_forced), so the
measured entries are NCCL's ring ones; planner/profile/physics.py models NVLS for targets that run with it.

What is timed is one table: TIMINGS, keyed by the names of planner.collectives.COLLECTIVES, says for each
collective which torch.distributed call runs it and how its buffers are shaped; a pairwise collective
(send/recv) is timed in the 2-rank group only.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from planner.collectives import collective_named

FORCED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
FIT_MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class CollectiveTiming:
    """How the profiler runs one collective of planner.collectives.COLLECTIVES (same name) to time it.

    numel is the collective's full buffer in elements (nccl-tests' size: all-gather output, reduce-scatter input),
    a multiple of the group size g.
    """

    name: str
    input_numel: Callable[[int, int], int]
    """(numel, g) -> elements of this rank's input buffer."""
    output_numel: Callable[[int, int], int]
    """(numel, g) -> elements of its output buffer; 0: the call runs in place on the input."""
    bind: Callable
    """(torch.distributed, input, output, group, rank) -> a closure that issues one call."""


def _whole(numel: int, g: int) -> int:
    return numel


def _in_place(numel: int, g: int) -> int:
    return 0


def _share(numel: int, g: int) -> int:
    return numel // g


def _bind_all_reduce(dist, inp, out, group, rank):
    return lambda: dist.all_reduce(inp, group=group)


def _bind_all_gather(dist, inp, out, group, rank):
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor   # renamed in torch 2.13
    return lambda: ag(out, inp, group=group)


def _bind_reduce_scatter(dist, inp, out, group, rank):
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor   # renamed in torch 2.13
    return lambda: rs(out, inp, group=group)


def _bind_all_to_all(dist, inp, out, group, rank):
    return lambda: dist.all_to_all_single(out, inp, group=group)


def _bind_send_recv(dist, inp, out, group, rank):
    """Rank 0 sends its buffer to rank 1, which receives it in place."""
    peer = 1 - rank
    if rank == 0:
        return lambda: dist.send(inp, dst=peer, group=group)
    return lambda: dist.recv(inp, src=peer, group=group)


TIMINGS: dict[str, CollectiveTiming] = {t.name: t for t in (
    CollectiveTiming("all_reduce", _whole, _in_place, _bind_all_reduce),
    CollectiveTiming("all_gather", _share, _whole, _bind_all_gather),
    CollectiveTiming("reduce_scatter", _whole, _share, _bind_reduce_scatter),
    CollectiveTiming("all_to_all", _whole, _whole, _bind_all_to_all),
    CollectiveTiming("send_recv", _whole, _in_place, _bind_send_recv),
)}
"""name -> how to time it; the profiler times every entry (OPS), in this order."""
OPS = tuple(TIMINGS)


def times_at(op: str, g: int) -> bool:
    """Whether `op` is timed in the group of g ranks: a pairwise collective (send/recv) only in the 2-rank group."""
    return g == 2 or not collective_named(op).pairwise


def force_env() -> None:
    """Set (not merely default) the variables that keep NVLink multicast off, here and in children."""
    os.environ.update(FORCED_ENV)


def message_sizes(device_type: str, quick: bool) -> list[int]:
    if device_type == "cuda":
        lo, hi, step = 4 << 10, 1 << 30, (4 if quick else 2)
    else:
        lo, hi, step = 4 << 10, (1 << 20) if quick else (4 << 20), 4
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    if out[-1] != hi:
        out.append(hi)
    return out


def group_sizes(world: int) -> list[int]:
    out, g = [], 2
    while g <= world:
        out.append(g)
        g *= 2
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the worker (runs in each spawned process) -------------------------------------------------------------

def _time_batch(fn, device, warmup: int, repeats: int, batch: int, group) -> float:
    from runtime.profiler.timing import hold_gpu

    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    # the host's cost to enqueue one collective (the calls return once queued, unless the queue is full: then
    # this over-estimates it, which only lengthens the spin below)
    host_call_s = (time.perf_counter() - t0) / max(warmup, 1)
    times = []
    align = torch.zeros(1, device=device)
    for _ in range(repeats):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # hold the GPU while the host enqueues the batch, as timing.time_fn does for kernels: a 1 MiB
            # collective runs in about 20 us on NVLink, about what c10d needs to enqueue one, so an unheld
            # batch times the host's pace (a 1 MiB all-reduce read 24 us in one run and 49 us in the next)
            hold_gpu(device, (batch + 1) * max(30e-6, 2.0 * host_call_s) + 50e-6)
            # line the ranks' GPUs up behind one tiny all-reduce: a small send completes without its receiver
            # (NCCL buffers it), so the untimed call below alone does not absorb the skew for send_recv
            # (without it, 4 KiB - 16 MiB points of 8 us and of 40-90 us in one profile)
            dist.all_reduce(align, group=group)
            # one untimed call first: the ranks leave barrier() and synchronize() at different host times,
            # and the first collective of a batch absorbs that skew (it waits for the later rank). Timing
            # from its end measures the collective, not the skew (timed from the start, a 4 MiB all-gather in a
            # batch of 4 read 97 us between 43 us at 8 MiB and 48 us at 2 MiB).
            fn()
            s.record()
            for _ in range(batch):
                fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3 / batch)
        else:
            t = time.perf_counter()
            for _ in range(batch):
                fn()
            times.append((time.perf_counter() - t) / batch)
    times.sort()
    med = times[len(times) // 2]
    # the slowest rank's median is the collective's time
    t = torch.tensor([med], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _worker(rank: int, world: int, device_type: str, port: int, job: dict, result_path: str, queue) -> None:
    force_env()
    import torch
    import torch.distributed as dist

    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        backend, dtype = "nccl", torch.bfloat16
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        backend, dtype = "gloo", torch.float32
    kw = {"device_id": device} if device_type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
    esize = torch.tensor([], dtype=dtype).element_size()
    results = []
    try:
        for g in job["group_sizes"]:
            group = dist.new_group(list(range(g)))
            if rank < g:
                _warm_up(job["ops"], g, rank, group, device, dtype)
                for op in job["ops"]:
                    if not times_at(op, g):
                        continue   # point-to-point: one pair, measured in the 2-rank group
                    for size in job["sizes"]:
                        numel = max(size // esize // g * g, g)
                        t = _time_op(op, numel, g, rank, group, device, dtype, job)
                        results.append({"op": op, "group_size": g, "bytes": numel * esize, "seconds": t})
                        if rank == 0 and queue is not None:
                            queue.put(("step", op, g, numel * esize))
            dist.barrier()
        if rank == 0:
            Path(result_path).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


WARM_UP_S = 0.5
"""Seconds of back-to-back collectives before the first timed one of a group (GPU only). The first op timed
(all-reduce at the smallest sizes) reads 20-66% slower at 1-4 MiB without it than the same sizes re-measured
later in the same run: a GPU leaving idle clocks and NCCL setting up its connections."""


def _warm_up(ops, g, rank, group, device, dtype) -> None:
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    numel = (64 << 20) // torch.tensor([], dtype=dtype).element_size() // g * g if cuda else g * 256
    fns = [_op_fn(op, numel, g, rank, group, device, dtype) for op in ops if times_at(op, g)]
    deadline = time.monotonic() + (WARM_UP_S if cuda else 0.0)
    while True:
        for fn in fns:
            fn()
        # every rank must run the same number of rounds (collectives pair up in order): stop when any is done
        done = torch.tensor([float(time.monotonic() >= deadline)], device=device)
        dist.all_reduce(done, op=dist.ReduceOp.MAX, group=group)
        if done.item():
            break


def _op_fn(op, numel, g, rank, group, device, dtype):
    """A closure running one `op` over `numel` elements of this rank's buffers (allocated once, as TIMINGS[op]
    shapes them)."""
    import torch
    import torch.distributed as dist

    timing = TIMINGS.get(op)
    if timing is None:
        raise ValueError(op)
    inp = torch.randn(timing.input_numel(numel, g), device=device, dtype=torch.float32).to(dtype)
    out_numel = timing.output_numel(numel, g)
    out = torch.empty(out_numel, device=device, dtype=dtype) if out_numel else inp
    return timing.bind(dist, inp, out, group, rank)


def _time_op(op, numel, g, rank, group, device, dtype, job) -> float:
    import torch

    size = numel * torch.tensor([], dtype=dtype).element_size()
    # batch short messages so that event overhead and rank skew average out
    batch = 2 if size >= (64 << 20) else (8 if size >= (4 << 20) else 20)
    if device.type != "cuda":
        batch = max(1, batch // 4)
    fn = _op_fn(op, numel, g, rank, group, device, dtype)
    return _time_batch(fn, device, job["warmup"], job["repeats"], batch, group)


# -- the parent ------------------------------------------------------------------------------------------------

def measure(device_type: str, world: int, quick: bool, progress=None, timeout_s: float = 600) -> list[dict]:
    """Spawns `world` processes and returns the raw points [{'op', 'group_size', 'bytes', 'seconds'}]."""
    import torch.multiprocessing as mp

    force_env()
    sizes = message_sizes(device_type, quick)
    job = {"group_sizes": group_sizes(world), "ops": list(OPS), "sizes": sizes,
           "warmup": 2 if quick else 3, "repeats": 5 if quick else 7}
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "collectives.json")
        pc = mp.start_processes(_worker, args=(world, device_type, _free_port(), job, out, queue), nprocs=world,
                                join=False, start_method="spawn")
        start = time.monotonic()
        while not pc.join(timeout=0.2):
            while not queue.empty():
                queue.get()
                if progress:
                    progress(1)
            if time.monotonic() - start > timeout_s:
                for p in pc.processes:
                    if p.is_alive():
                        p.terminate()
                raise TimeoutError(f"collective timing did not finish within {timeout_s:.0f} s")
        while not queue.empty():
            queue.get()
            if progress:
                progress(1)
        return json.loads(Path(out).read_text())


def steps(world: int, device_type: str, quick: bool) -> int:
    """How many progress steps `measure` reports (for the progress bar)."""
    n = len(message_sizes(device_type, quick))
    gs = group_sizes(world)
    return sum(n * sum(times_at(op, g) for op in OPS) for g in gs)


def fit_points(raw: list[dict], link: str, fit_min_bytes: int = FIT_MIN_BYTES):
    """One planner.profile.CollectiveFit per (op, group size), fitted to the points of fit_min_bytes and up
    (all points when fewer than two reach it); every measured point is kept in the fit's `points`."""
    from planner.profile import bus_factor, fit_collective

    fits, errors = [], {}
    keys = sorted({(r["op"], r["group_size"]) for r in raw})
    for op, g in keys:
        pts = sorted((r["bytes"], r["seconds"]) for r in raw if r["op"] == op and r["group_size"] == g)
        big = [p for p in pts if p[0] >= fit_min_bytes]
        use = big if len(big) >= 2 else pts
        fit = fit_collective(use, op, g, link, measured=True)
        degenerate = _degenerate(fit, use)
        if degenerate:
            # noise made the slope non-positive (seen with gloo on a busy CPU): fall back to the conservative
            # bound latency = fastest time, bandwidth = the largest message's size over its whole time
            b_max, t_max = use[-1]
            fit = dataclasses.replace(fit, latency_s=min(t for _, t in use),
                                      bus_bandwidth_bytes_per_s=b_max * bus_factor(op, g) / t_max)
        fit = dataclasses.replace(fit, points=tuple((float(b), float(t)) for b, t in pts))
        fits.append(fit)
        rel = [fit.time_s(b) / t - 1 for b, t in use]
        errors[f"{op}/{g}"] = {"fit_from_bytes": use[0][0], "degenerate_fit_replaced": degenerate,
                               "max_abs_rel_error": max(abs(r) for r in rel),
                               "median_abs_rel_error": sorted(abs(r) for r in rel)[len(rel) // 2]}
    return fits, errors


def _degenerate(fit, pts) -> bool:
    """True when the fitted bandwidth term is negligible at the largest size although that size took several
    times the smallest one's time (a clamped, non-positive slope)."""
    from planner.profile import bus_factor

    (_, t0), (b1, t1) = pts[0], pts[-1]
    bw_term = b1 * bus_factor(fit.op, fit.group_size) / fit.bus_bandwidth_bytes_per_s
    return bw_term < 0.01 * t1 and (t1 > 2 * t0 or fit.bus_bandwidth_bytes_per_s >= 1e14)
