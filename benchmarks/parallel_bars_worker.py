"""The worker of benchmarks/parallel_bars.py (its --worker mode, run under torchrun): one training run of a bar's
plan, runtime/train.py's loop plus what the bars record (every step's time and peak memory, the pipeline's action
timeline, and one extra profiled step whose trace gives the exposed communication)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def exposed_from_trace(path: str, cuda: bool, steps: int) -> dict:
    """Per-step exposed communication of one rank from its chrome trace (seconds)."""
    from runtime.trace_analysis import measure, uncovered, union_intervals

    ev = json.load(open(path))
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    p2p, coll, comp, host = [], [], [], []
    for e in ev:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name, cat = str(e.get("name", "")), str(e.get("cat", ""))
        iv = (float(e["ts"]) * 1e-6, (float(e["ts"]) + float(e["dur"])) * 1e-6)
        if cuda:
            if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
                continue
            if name.startswith("nccl"):
                (p2p if ("SendRecv" in name or "Send" in name or "Recv" in name) else coll).append(iv)
            else:
                comp.append(iv)
        elif cat == "cpu_op" and name.startswith("c10d::"):
            low = name.lower()
            (p2p if ("alltoall" in low or "send" in low or "recv" in low) else coll).append(iv)
        elif cat == "cpu_op":
            host.append(iv)
    P, C, K = union_intervals(p2p), union_intervals(coll), union_intervals(comp)
    allc = union_intervals(p2p + coll)
    if cuda:
        e_p2p, e_coll, e_all = uncovered(P, K), uncovered(C, K), uncovered(allc, K)
        busy = union_intervals(p2p + coll + comp)
        span = (busy[-1][1] - busy[0][0]) if busy else 0.0
        idle = span - measure(busy)
        method = "NCCL kernels not overlapped by non-NCCL kernels (torch.profiler CUDA trace)"
    else:   # gloo ops are synchronous on the host: their whole span is exposed
        e_p2p, e_coll, e_all = measure(P), measure(C), measure(allc)
        idle, span = 0.0, 0.0
        method = "host spans of c10d ops (gloo, synchronous)"
    n = max(steps, 1)
    return dict(method=method, p2p_total_s=measure(P) / n, p2p_exposed_s=e_p2p / n, coll_total_s=measure(C) / n,
                coll_exposed_s=e_coll / n, comm_exposed_s=e_all / n, gpu_idle_s=idle / n, trace_span_s=span / n)


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    from planner.lr_schedule import LrSchedule
    from planner.plan import Plan
    from runtime.data import Prefetcher, open_source, step_micro_batches
    from runtime.mesh import build_groups
    from runtime.parallel.data_parallel import AdamConfig, build_optimizer
    from runtime.step import select_train_step
    from runtime.train import build_rank_stages

    plan = Plan.load(Path(args.plan))
    spec, lay, shape = plan.model, plan.layout, plan.training
    cuda = args.device == "cuda"
    from runtime.mesh import init_distributed

    local_rank = init_distributed(cuda, timeout_min=5)
    rank, world = dist.get_rank(), dist.get_world_size()

    def emit(**kw):   # written at once, so a run that dies or times out keeps what it measured
        if rank == 0:
            with open(args.record, "a") as f:
                f.write(json.dumps(dict(run=args.tag, **kw)) + "\n")

    try:
        groups = build_groups(lay, "cuda" if cuda else "cpu")
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        t_build = time.perf_counter()
        stages = build_rank_stages(plan, groups, device, lay.overlap_tp, 1234)
        compute = torch.bfloat16 if cuda else torch.float32
        opt = build_optimizer(stages, groups, lay.sharding, AdamConfig(lr=3e-4), compute, lay.overlap_dp)
        step_fn = select_train_step(lay)
        source = open_source("synthetic", spec.vocab_size, shape.seq_len, None, seed=1234)

        def make_step(step):
            return step_micro_batches(source, spec.family, spec.vocab_size, shape.seq_len, shape.global_batch,
                                      lay.micro_batch, lay.dp, groups.dp_rank, step, lay.cp, groups.cp_rank, seed=1234)

        prefetch = Prefetcher(make_step, 0, device)
        emit(kind="build", build_s=time.perf_counter() - t_build, world=world)
        tokens = shape.global_batch * shape.seq_len
        m = plan.num_micro_batches
        total = args.warmup + args.steps
        prof_sum: dict = {}
        try:
            for step in range(total + args.profile_steps):
                profiling = step >= total
                mbs, wait = prefetch.next()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                    torch.cuda.synchronize()
                dist.barrier()
                if profiling:   # the trace covers exactly the train_step call (and its final synchronize)
                    from torch.profiler import ProfilerActivity, profile
                    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
                    prof.__enter__()
                t0 = time.perf_counter()
                loss, norm = step_fn(stages, mbs, opt, groups, LrSchedule().at(step))
                if cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if profiling:
                    prof.__exit__(None, None, None)
                    path = os.path.join(args.tmp, f"{args.tag}-trace-{rank}.json")
                    prof.export_chrome_trace(path)
                    one = exposed_from_trace(path, cuda, 1)
                    os.remove(path)
                    for k, v in one.items():
                        if isinstance(v, float):
                            prof_sum[k] = prof_sum.get(k, 0.0) + v / args.profile_steps
                        else:
                            prof_sum[k] = v
                dts = [None] * world
                dist.all_gather_object(dts, dt)
                dt = max(dts)
                peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
                peaks = [None] * world
                dist.all_gather_object(peaks, peak)
                rec = dict(kind="step", step=step + 1, timed=args.warmup <= step < total, profiled=profiling,
                           loss=float(loss), step_s=dt, tokens_per_s=tokens / dt, tokens_per_s_per_gpu=tokens / dt / world,
                           peak_mem_gib_max=max(peaks), data_wait_s=wait)
                if lay.pp > 1 and not profiling:
                    from runtime.parallel.pipeline import (analytic_bubble_fraction, gather_timeline,
                                                           measured_bubble_fraction)
                    tl = gather_timeline(groups)
                    t_r = [sum(a["end"] - a["start"] for a in rank_tl) / m for rank_tl in tl]
                    span = max(a["end"] for x in tl for a in x) - min(a["start"] for x in tl for a in x)
                    rec.update(bubble_measured=measured_bubble_fraction(tl), t_r_s=t_r, pipeline_span_s=span,
                               bubble_analytic_measured_t=analytic_bubble_fraction(t_r, m, lay.vpp), m=m, vpp=lay.vpp)
                    if step == total - 1:
                        emit(kind="timeline", step=step + 1, timeline=tl)
                emit(**rec)
                if rank == 0:
                    extra = f" bubble {rec['bubble_measured']:.4f}" if "bubble_measured" in rec else ""
                    print(f"[{args.tag}] step {step + 1}{' (profiled)' if profiling else ''} loss {float(loss):.4f} "
                          f"step_s {dt:.4f} tok/s/gpu {tokens / dt / world:.1f}{extra}", flush=True)
            if args.profile_steps:
                allr = [None] * world
                dist.all_gather_object(allr, prof_sum)
                emit(kind="profile", per_rank=allr, steps=args.profile_steps)
        finally:
            prefetch.close()
        return 0
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# the driver

