"""The training worker that `plan launch` starts under torchrun (one process per GPU).

    python -m torch.distributed.run --nproc-per-node N -m runtime.train --plan plan.json [...]

Builds the process groups, this rank's pipeline stage(s) with the plan's recompute, the optimizer at the
plan's sharding level, then loops: next step's micro-batches (prefetched), `train_step`, log, checkpoint.
Rank 0 prints one line per step and appends it to the results CSV. With --components-out (plan validate),
one extra step after the last runs under torch.profiler and every rank's GPU compute, exposed communication
and idle time go to a JSON file; that step is not logged and comes after the exit checkpoint.
"""
from __future__ import annotations

import argparse
import csv
import gc
import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # a worker: bound to its parent and beating before the seconds of heavy imports below
    from runtime.supervise import arm_worker
    arm_worker()

import torch
import torch.distributed as dist

from planner.errors import PlanError
from planner.launch_command import WORKER_ERROR_FILE_ENV
from planner.lr_schedule import add_options as add_optimizer_options
from planner.lr_schedule import add_resume_option
from planner.lr_schedule import from_args as optimizer_settings
from planner.plan import Plan
from runtime import checkpoint, supervise
from runtime.data import Prefetcher, open_source, step_micro_batches
from runtime.mesh import build_groups
from runtime.model import build_stage
from runtime.parallel.data import GRAD_DTYPES, AdamConfig, build_optimizer
from runtime.step import select_train_step
from runtime.trace_analysis import RankComponents

NOT_TRACED_ON_CPU = "not traced on CPU (no GPU kernels to time)"
"""--components-out's marker on CPU, in place of the components."""

GC_EVERY_STEPS = 50
"""Steps between the training loop's own garbage collections (automatic collection is off while it runs)."""

CSV_FIELDS = ["step", "loss", "grad_norm", "step_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_mem_gib",
              "data_wait_s", "lr", "peak_mem_max_gib", "peak_mem_by_rank", "optimizer_s", "bubble_frac", "end_unix_s"]
"""peak_mem_gib is rank 0's; peak_mem_max_gib the max over all ranks and peak_mem_by_rank every rank's
(';'-joined, global rank order), both CUDA only. optimizer_s: clip + AdamW of the slowest rank (CUDA events,
no extra synchronisation). bubble_frac: the pipeline's measured bubble (pp > 1, from its action timeline).
end_unix_s: wall clock when rank 0 saw the step finish (plan validate matches the GPUs' clock samples to it)."""


def stage_ranges(plan: Plan) -> list[tuple[int, int]]:
    """[start, end) layers of every virtual stage, in model order."""
    out, start = [], 0
    for s in plan.stages:
        out.append((start, start + s.layers))
        start += s.layers
    return out


def build_rank_stages(plan: Plan, groups, device, overlap_tp: bool, seed: int, compile: bool = False):
    ranges = stage_ranges(plan)
    last = len(plan.stages) - 1
    stages = []
    for j in plan.stages_of_rank(groups.pp_rank):
        a, b = ranges[j]
        stages.append(build_stage(plan.model, groups, a, b, j == 0, j == last, plan.stages[j].layer_modes(),
                                  overlap=overlap_tp, device=device, seed=seed, compile=compile,
                                  fp8=plan.layout.fp8))
    return stages


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="runtime.train")
    ap.add_argument("--plan", required=True, nargs="+", help="plan file(s); several run one after another")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--data-dtype", default=None)
    ap.add_argument("--ckpt-dir", default=None)
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    add_resume_option(ap)
    ap.add_argument("--results", default=None)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="per-GPU dense bf16 peak for MFU")
    add_optimizer_options(ap)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action="store_true", help="torch.compile each transformer layer")
    ap.add_argument("--trace-step", type=int, default=0,
                    help="run this step (1-based) under torch.profiler and write its op tables (diagnosis)")
    ap.add_argument("--trace-out", default=None, help="text file for --trace-step's tables (rank 0)")
    ap.add_argument("--components-out", default=None,
                    help="run one extra step after --steps under torch.profiler (not logged) and write every rank's "
                         "GPU compute, exposed communication and idle time to this JSON file (rank 0); with "
                         "several plans a folder: DIR/<plan stem>.components.json")
    ap.add_argument("--memory-step", type=int, default=0,
                    help="record the CUDA allocator during this step (1-based): what is alive at its peak")
    ap.add_argument("--memory-out", default=None, help="prefix of --memory-step's files: PREFIX.rank<r>.json")
    return ap.parse_args(argv)


class _StopFlag:
    """Set by SIGTERM/SIGINT; `agreed()` all-reduces it so every rank leaves the loop at the same step
    (then the run saves its checkpoint at exit). A CPU tensor: on GPU runs the default group's gloo side
    carries it, so asking never waits for the GPU (the loop keeps one step queued ahead)."""

    def __init__(self):
        self.flag = torch.zeros(1)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, *_):
        self.flag.fill_(1.0)

    def agreed(self) -> bool:
        f = self.flag.clone()
        if dist.get_world_size() > 1:
            dist.all_reduce(f, op=dist.ReduceOp.MAX)
        return bool(f.item())


class _Clock:
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
class _LaunchedStep:
    """A step whose work is queued on the GPU; read back (`_finish`) once the next one is queued too.
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


def _per_rank_stats(peak_gib: float, optimizer_s: float, world: int) -> list[tuple[float, float]]:
    """(peak allocated GiB, optimizer seconds) of every rank. CPU tensors (gloo on GPU runs): no GPU sync."""
    mine = torch.tensor([peak_gib, optimizer_s], dtype=torch.float64)
    if world == 1:
        return [(peak_gib, optimizer_s)]
    out = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(out, mine)
    return [(float(t[0]), float(t[1])) for t in out]


def _bubble_fraction(groups) -> float:
    from runtime.parallel.pipeline import gather_timeline, measured_bubble_fraction
    return measured_bubble_fraction(gather_timeline(groups))


def _traced(args, cuda: bool, fn):
    """One step under torch.profiler; rank 0 writes the ops by device time and (one process, or CPU) by host
    time. With several GPU processes only the device is traced: the host profiler's per-op cost slowed a
    host-paced TP2 step from 0.2 s to 3.9 s, and its NCCL kernels then waited on the slow peer,
    which made the exposed-communication figure meaningless."""
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


def _write_json(path: str, data: dict) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)  # a reader never sees half a file


def _traced_components(run_step) -> RankComponents:
    """This rank's GPU timeline of run_step(), one training step. Only the device is traced: host tracing slowed
    a host-paced step twenty-fold (see _traced). The GPU is drained first, so the span holds this step alone."""
    from torch.profiler import ProfilerActivity, profile

    from runtime.trace_analysis import kernels_of

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_step()
        torch.cuda.synchronize()
    return RankComponents.from_kernels(dist.get_rank(), kernels_of(prof))


def write_step_components(path: str, cuda: bool, step: int, run_step) -> None:
    """--components-out: every rank traces run_step() (one extra training step), rank 0 gathers the ranks'
    components and writes them as JSON. On CPU nothing runs and rank 0 writes the NOT_TRACED_ON_CPU marker."""
    rank0 = dist.get_rank() == 0
    if not cuda:
        if rank0:
            _write_json(path, {"traced": False, "reason": NOT_TRACED_ON_CPU})
        return
    mine = _traced_components(run_step).to_dict()
    ranks = [mine]
    if dist.get_world_size() > 1:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    if rank0:
        _write_json(path, {"traced": True, "step": step, "ranks": ranks})
        print(f"traced step {step} (one extra step, not in the step CSV): components in {path}", flush=True)


def train_plan(plan: Plan, args, groups, cuda: bool, local_rank: int, results_path: str | None,
               components_path: str | None = None) -> None:
    """Build this rank's stages and optimizer for `plan` and train args.steps steps (every rank calls it); with
    components_path, then one traced step more (write_step_components)."""
    spec, lay, shape = plan.model, plan.layout, plan.training
    rank0 = dist.get_rank() == 0
    source = open_source(args.data, spec.vocab_size, shape.seq_len, args.data_dtype, seed=args.seed)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if lay.fp8:
        from runtime.parallel.fp8 import check_fp8_device
        why = check_fp8_device(device)
        if why:
            raise PlanError(why)
    stages = build_rank_stages(plan, groups, device, lay.overlap_tp, args.seed, args.compile)
    compute = torch.bfloat16 if cuda else torch.float32
    settings = optimizer_settings(args)
    adam = AdamConfig(lr=settings.schedule.peak_lr, weight_decay=settings.weight_decay, grad_clip=settings.clip_grad)
    opt = build_optimizer(stages, groups, lay.sharding, adam, compute, lay.overlap_dp,
                          grad_dtype=GRAD_DTYPES[lay.grad_dtype])
    plan_hash = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    start = 0
    if args.resume:
        start = checkpoint.load(args.ckpt_dir, opt, groups)
        supervise.progress(start)
        if rank0:
            print(f"resumed from {checkpoint.step_dir(args.ckpt_dir, start)}", flush=True)
            for leftover in checkpoint.incomplete_leftovers(args.ckpt_dir):
                print(f"note: skipped '{leftover}', left incomplete by an interrupted save", flush=True)
            if results_path:
                set_aside_rows_after(Path(results_path), start)
    step_fn = select_train_step(lay)
    graphed = None
    if cuda and lay.cuda_graph:  # on CPU the same plan runs eagerly: graphs are a CUDA feature
        from runtime.graph import GraphedStep
        graphed = step_fn = GraphedStep(step_fn, opt)

    def make_step(step):
        return step_micro_batches(source, spec.family, spec.vocab_size, shape.seq_len, shape.global_batch,
                                  lay.micro_batch, lay.dp, groups.dp_rank, step, lay.cp, groups.cp_rank,
                                  seed=args.seed)

    prefetch = Prefetcher(make_step, start, device)
    writer, results = None, None
    if rank0 and results_path:
        new = not Path(results_path).exists() or Path(results_path).stat().st_size == 0
        fields = CSV_FIELDS
        if not new:  # a resumed run appends under the file's own header (one written before a column was added)
            with open(results_path, newline="") as fh:
                fields = next(csv.reader(fh), None) or CSV_FIELDS
        _end_with_newline(Path(results_path))  # a row glued onto an unterminated last line would be lost
        results = open(results_path, "a", newline="")
        writer = csv.DictWriter(results, fieldnames=fields, extrasaction="ignore")
        if new:
            writer.writeheader()
    tokens = shape.global_batch * shape.seq_len
    flops = spec.model_flops_per_token(shape.seq_len) * tokens
    world = dist.get_world_size()
    last_saved = start if args.resume else None
    stop = _StopFlag()
    clock = _Clock(cuda)
    # One step stays queued ahead: step N+1 is launched before step N's numbers are read back, so the host
    # launches N+1's first kernels while the GPU still runs N's optimizer, rather than the GPU idling at every
    # step start until the host catches up (as a loop that synchronises each step would make it). Pipelines
    # (their timeline is read back per step), traced steps and checkpointed steps are read back at once.
    queue_ahead = lay.pp == 1 or graphed is not None

    def finish(rec: _LaunchedStep) -> bool:
        """Wait for a launched step, log it; returns whether any rank was asked to stop."""
        if cuda:
            rec.end.synchronize()
        dt = clock.seconds(rec.start, rec.end)
        per_rank = _per_rank_stats(rec.peak_mem_gib, clock.seconds(rec.optimizer_start, rec.end), world)
        # a replayed pipeline step records no timeline (runtime/graph.py): its bubble is not measured
        bubble = _bubble_fraction(groups) if lay.pp > 1 and not rec.replayed else None
        tflops = flops / dt / world / 1e12
        loss, grad_norm = rec.loss_and_norm.tolist()
        row = dict(step=rec.step, loss=f"{loss:.6f}", grad_norm=f"{grad_norm:.5g}",
                   step_s=f"{dt:.5g}", tokens_per_s=f"{tokens / dt:.6g}", tflops_per_gpu=f"{tflops:.4g}",
                   mfu=f"{tflops / args.peak_tflops:.4g}", peak_mem_gib=f"{rec.peak_mem_gib:.4g}" if cuda else "",
                   data_wait_s=f"{rec.data_wait_s:.4g}", lr=f"{rec.lr:.4g}",
                   peak_mem_max_gib=f"{max(m for m, _ in per_rank):.4g}" if cuda else "",
                   peak_mem_by_rank=";".join(f"{m:.4g}" for m, _ in per_rank) if cuda else "",
                   # a replayed CUDA graph has no event between backward and the optimizer: not measured
                   optimizer_s=f"{max(o for _, o in per_rank):.4g}" if rec.optimizer_start is not None else "",
                   bubble_frac=f"{bubble:.4g}" if bubble is not None else "",
                   end_unix_s=f"{time.time():.3f}")
        if rank0:
            print(" ".join(f"{k} {v}" for k, v in row.items() if k != "end_unix_s"), flush=True)
            if writer:
                writer.writerow(row)
                results.flush()
        supervise.progress(rec.step)  # the launcher's monitor: this rank is not stuck
        return stop.agreed()  # SIGTERM / SIGINT on any rank: every rank stops after the same step

    pending: _LaunchedStep | None = None
    done = start
    # Python's cyclic garbage collector pauses the host at unpredictable points, and a paused host leaves
    # the GPU idle in a launch-bound step; it runs between steps instead, every GC_EVERY_STEPS (Megatron's
    # manual GC). Objects alive now (the model, the optimizer) are frozen out of its scans.
    gc.collect()
    gc.freeze()
    gc.disable()
    stopped = False
    try:
        for step in range(start, start + args.steps):
            if step > start and (step - start) % GC_EVERY_STEPS == 0:
                gc.collect()
            profiled = args.trace_step == step + 1
            memory = cuda and args.memory_step == step + 1 and bool(args.memory_out)
            traced = profiled or memory  # a profiled or memory-recorded step runs alone, not queued
            stopped = False
            if pending is not None and traced:
                stopped, pending = finish(pending), None
                if stopped:
                    break
            start_mark = clock.mark()
            mbs, wait = prefetch.next()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            lr = settings.schedule.at(step)
            opt_marks = []

            def run():
                return step_fn(stages, mbs, opt, groups, lr, before_step=lambda: opt_marks.append(clock.mark()))

            if memory:
                from runtime import memory_trace
                (loss, norm), summary = memory_trace.record_step(run, local_rank)
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
            # queued behind the previous step: timed from that step's end, so GPU idle between the two counts
            peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
            replayed = graphed is not None and graphed.replaying
            if replayed:  # a replay allocates nothing; its capture held the peak
                peak_gib = max(peak_gib, graphed.peak_mem_gib)
            rec = _LaunchedStep(step + 1, numbers, peak_gib,
                                wait, lr, pending.end if pending is not None else start_mark,
                                opt_marks[0] if opt_marks else None, clock.mark(),
                                replayed=replayed)
            done = step + 1
            if pending is not None:
                stopped, pending = finish(pending), None
            save_due = bool(args.ckpt_dir and args.save_every and done % args.save_every == 0)
            if queue_ahead and not (traced or save_due or stopped):
                pending = rec
                continue
            stopped = finish(rec) or stopped
            if save_due:
                if graphed is not None:
                    graphed.sync_params()
                checkpoint.save(args.ckpt_dir, done, opt, groups, settings, plan_hash)
                supervise.progress()
                last_saved = done
            if stopped:
                if rank0:
                    print(f"stopping after step {done} (signal)", flush=True)
                break
        if pending is not None:
            if finish(pending):
                stopped = True
                if rank0:
                    print(f"stopping after step {done} (signal)", flush=True)
            pending = None
        if graphed is not None:
            graphed.sync_params()
        if args.ckpt_dir and last_saved != done:
            checkpoint.save(args.ckpt_dir, done, opt, groups, settings, plan_hash)  # at exit
        if components_path and not stopped:
            # after the exit checkpoint, which holds step `done`: the extra step's update is never saved or
            # logged, so neither a resumed run nor the step statistics see it
            mbs = prefetch.next()[0]  # fetched before the trace: its host-to-device copy is not the step's
            lr = settings.schedule.at(done)
            write_step_components(components_path, cuda, done + 1, lambda: step_fn(stages, mbs, opt, groups, lr))
    finally:
        gc.enable()
        gc.unfreeze()
        prefetch.close()
        if results:
            results.close()
        opt.close()


def _end_with_newline(path: Path) -> None:
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) not in (b"\n", b"\r"):
                fh.write(b"\n")


def set_aside_rows_after(path: Path, step: int) -> Path | None:
    """A resumed run continues its step CSV from `step`. Rows of later steps, logged by the interrupted run after
    its last checkpoint, would otherwise sit beside the resumed run's rows for the same steps: they move to
    <stem>.superseded-after-step-<step><suffix> (with the header), so nothing is lost or doubled. Returns that file."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    if "step" not in header:
        return None
    col = header.index("step")
    later = [r for r in body if _row_step(r, col) > step]
    if not later:
        return None
    aside = path.with_name(f"{path.stem}.superseded-after-step-{step}{path.suffix}")
    n = 2
    while aside.exists():
        aside = path.with_name(f"{path.stem}.superseded-after-step-{step}-{n}{path.suffix}")
        n += 1
    with open(aside, "w", newline="") as fh:
        csv.writer(fh).writerows([header] + later)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        csv.writer(fh).writerows([header] + [r for r in body if _row_step(r, col) <= step])
    tmp.replace(path)
    print(f"note: moved {len(later)} row(s) of steps after {step} from '{path}' (logged after the last "
          f"checkpoint) to '{aside}'", flush=True)
    return aside


def _row_step(row: list[str], col: int) -> int:
    """A row's step; a row without a readable one counts as step 0, so it stays where it is."""
    try:
        return int(row[col])
    except (IndexError, ValueError):
        return 0


def check_args(args, many: bool) -> None:
    """What every worker checks before it joins the process group (`plan launch` checked it before torchrun; this
    guards a worker started by hand, or files changed since), so every rank stops with the same sentence before
    any work instead of failing after training."""
    if args.steps < 1:
        raise PlanError(f"--steps must be at least 1, got {args.steps}")
    settings = optimizer_settings(args)
    if args.resume and not args.ckpt_dir:
        raise PlanError("--resume needs --ckpt-dir")
    if args.override_lr_schedule and not args.resume:
        raise PlanError("--override-lr-schedule needs --resume")
    if args.ckpt_dir:
        # sizes and small files here, on every rank; rank 0 hashes every file in checkpoint.load
        checkpoint.check_dir(args.ckpt_dir, args.resume, settings, args.override_lr_schedule, full=False)
    for name, value in (("results", args.results), ("components", args.components_out)):
        if value:
            folder = Path(value) if many else Path(value).parent
            if not folder.is_dir():
                raise PlanError(f"the folder '{folder}' for the {name} does not exist")


def report_error(exc: PlanError) -> None:
    """The worker's one sentence. Under `plan launch` (WORKER_ERROR_FILE_ENV set) the first rank to fail writes it
    to that file and the launcher prints it once, in place of torchrun's traceback; otherwise to stderr."""
    path = os.environ.get(WORKER_ERROR_FILE_ENV)
    if path:
        try:
            with open(path, "x") as fh:  # exclusive: the first rank's report stands, the others would repeat it
                fh.write(f"{exc.exit_code}\n{exc}\n")
            return
        except FileExistsError:
            return
        except OSError:
            pass
    print(f"error: {exc}", file=sys.stderr)


def _release(cuda: bool) -> None:
    """Between plans of one worker: free the previous plan's tensors so its peak does not leak into the next."""
    import gc

    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        # cuBLAS workspaces (32 MiB per stream that ran a GEMM) live until cleared: the next plan allocates its
        # own, as in a fresh process, and its peak counts them as the planner does (planner/memory.py)
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def main(argv=None) -> int:
    """One plan (`plan launch`), or several in a row (`plan validate` of several plans: one start-up, the
    process groups reused between plans of the same degrees). With several plans --results is a folder:
    plan i writes DIR/<plan file stem>.csv and, once finished, DIR/<stem>.done (and --components-out a folder
    for DIR/<stem>.components.json)."""
    args = parse_args(argv)
    paths = [Path(p) for p in args.plan]
    plans = [Plan.load(p) for p in paths]
    many = len(plans) > 1
    if many and (args.ckpt_dir or args.resume):
        raise PlanError("checkpoints (--ckpt-dir, --resume) need a single --plan")
    if many and not args.results:
        raise PlanError("several plans need --results FOLDER for their per-step CSVs")
    check_args(args, many)
    cuda = args.device == "cuda"
    from runtime.mesh import init_distributed

    local_rank = init_distributed(cuda, timeout_min=10)
    rank0 = dist.get_rank() == 0
    groups_of: dict[tuple, object] = {}
    try:
        for path, plan in zip(paths, plans):
            lay = plan.layout
            key = (lay.tp, lay.cp, lay.dp, lay.pp, lay.ep)
            if key not in groups_of:
                groups_of[key] = build_groups(lay, "cuda" if cuda else "cpu")
            groups = groups_of[key]
            groups.layout = lay  # same degrees; the rest of the layout is this plan's
            results = str(Path(args.results) / f"{path.stem}.csv") if many else args.results
            components = args.components_out
            if components and many:
                components = str(Path(components) / f"{path.stem}.components.json")
            if many and rank0:
                print(f"=== plan {path.stem}: {plan.model.name} {lay.short()} mb{lay.micro_batch}", flush=True)
            train_plan(plan, args, groups, cuda, local_rank, results, components)
            if many:
                _release(cuda)
                if rank0:
                    (Path(args.results) / f"{path.stem}.done").touch()
            supervise.progress()
        supervise.finished()
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    supervise.die_with_parent()  # torchrun gone, for whatever reason: so is this worker
    supervise.start_heartbeat()
    try:
        sys.exit(main())
    except PlanError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
