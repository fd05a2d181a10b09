"""The training worker that `plan launch` starts under torchrun (one process per GPU).

    python -m torch.distributed.run --nproc-per-node N -m runtime.train --plan plan.json [...]

Builds the process groups, then for each plan a trainer in three parts, as torchtitan's is:
- build (`build_trainer`): this rank's pipeline stage(s) with the plan's recompute, the optimizer at the plan's
  sharding level, the checkpoint's state on --resume, the step function, the data prefetcher, the step log;
- step (`launch_step`): the next step's micro-batches (prefetched) through `train_step`, queued on the device;
- log (`StepLog.record`): the step read back, rank 0 printing one line and appending it to the results CSV.
`run_steps` runs the loop (one step queued ahead, checkpoints every --save-every steps, a signal stops every
rank after the same step) and `finish_run` saves at exit. With --components-out (plan validate),
one extra step after the last runs under torch.profiler and every rank's GPU compute, exposed communication
and idle time go to a JSON file; that step is not logged and comes after the exit checkpoint.
"""
from __future__ import annotations

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
from planner.lr_schedule import OptimizerSettings
from planner.lr_schedule import from_args as optimizer_settings
from planner.plan import Plan, stage_layer_ranges
from runtime import checkpoint, supervise
from runtime.data import Prefetcher, open_source, step_micro_batches
from runtime.mesh import build_groups
from runtime.model import build_stage
from runtime.parallel.data_parallel import GRAD_DTYPES, AdamConfig, build_optimizer
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


def build_rank_stages(plan: Plan, groups, device, overlap_tp: bool, seed: int, compile: bool = False):
    """This rank's Stage modules, one per virtual stage it holds (model order), each with its layers' recompute
    modes, FP8 setting and optional torch.compile."""
    ranges = stage_layer_ranges(plan.stages)
    last = len(plan.stages) - 1
    stages = []
    for j in plan.stages_of_rank(groups.pp_rank):
        a, b = ranges[j]
        stages.append(build_stage(plan.model, groups, a, b, j == 0, j == last, plan.stages[j].layer_modes(),
                                  overlap=overlap_tp, device=device, seed=seed, compile=compile,
                                  fp8=plan.layout.fp8))
    return stages


def parse_args(argv=None):
    """The worker's arguments: the plan file(s), the flags `plan launch` passes on (declared once, with their range
    checks, in planner/launch_command.py) and the worker's own diagnosis flags. A bad value raises PlanError with
    the sentence `plan launch` gives for it."""
    from planner.arguments import Parser
    from planner.launch_command import WORKER_FLAGS, add_launch_flags
    from planner.limits import MAX_STEPS, int_arg

    ap = Parser(prog="runtime.train")
    ap.add_argument("--plan", required=True, nargs="+", help="plan file(s); several run one after another")
    add_launch_flags(ap, WORKER_FLAGS)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--trace-step", type=int_arg("--trace-step", 0, MAX_STEPS), default=0,
                    help="run this step (1-based) under torch.profiler and write its op tables (diagnosis)")
    ap.add_argument("--trace-out", default=None, help="text file for --trace-step's tables (rank 0)")
    ap.add_argument("--components-out", default=None,
                    help="run one extra step after --steps under torch.profiler (not logged) and write every rank's "
                         "GPU compute, exposed communication and idle time to this JSON file (rank 0); with "
                         "several plans a folder: DIR/<plan stem>.components.json")
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


def _write_json(path: str, data: dict) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)  # a reader never sees half a file


def _traced_components(run_step) -> RankComponents:
    """This rank's GPU timeline of run_step(), one training step. Only the device is traced: host tracing slows
    a host-paced step about twenty-fold (see _traced). The GPU is drained first, so the span holds this step
    alone."""
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


class StepLog:
    """The log part of the trainer: reads a launched step back and records it.

    `record` waits for the step's work, gathers every rank's peak memory and optimizer time (and the pipeline's
    bubble), prints one line and appends one CSV row on rank 0, tells the launcher's monitor that this rank made
    progress, and returns whether any rank was asked to stop. Every rank calls it for every step, in the same
    order: it runs collectives.
    """

    def __init__(self, plan: Plan, args, groups, cuda: bool, results_path: str | None, clock: _Clock,
                 stop: _StopFlag):
        self.plan, self.args, self.groups, self.cuda = plan, args, groups, cuda
        self.clock, self.stop = clock, stop
        self.rank0 = dist.get_rank() == 0
        self.world = dist.get_world_size()
        shape = plan.training
        self.tokens = shape.global_batch * shape.seq_len
        self.flops = plan.model.model_flops_per_token(shape.seq_len) * self.tokens
        self.results, self.writer = None, None
        self.last_saved: int | None = None  # the newest step checkpointed, for the sentence of a failed write
        if self.rank0 and results_path:
            self.results, self.writer = _open_results(Path(results_path))

    def record(self, rec: _LaunchedStep) -> bool:
        """Wait for a launched step and log it; returns whether any rank was asked to stop."""
        if self.cuda:
            rec.end.synchronize()
        clock, cuda, lay = self.clock, self.cuda, self.plan.layout
        dt = clock.seconds(rec.start, rec.end)
        per_rank = _per_rank_stats(rec.peak_mem_gib, clock.seconds(rec.optimizer_start, rec.end), self.world)
        # a replayed pipeline step records no timeline (runtime/graph.py): its bubble is not measured
        bubble = _bubble_fraction(self.groups) if lay.pp > 1 and not rec.replayed else None
        tflops = self.flops / dt / self.world / 1e12
        loss, grad_norm = rec.loss_and_norm.tolist()
        row = dict(step=rec.step, loss=f"{loss:.6f}", grad_norm=f"{grad_norm:.5g}",
                   step_s=f"{dt:.5g}", tokens_per_s=f"{self.tokens / dt:.6g}", tflops_per_gpu=f"{tflops:.4g}",
                   mfu=f"{tflops / self.args.peak_tflops:.4g}",
                   peak_mem_gib=f"{rec.peak_mem_gib:.4g}" if cuda else "",
                   data_wait_s=f"{rec.data_wait_s:.4g}", lr=f"{rec.lr:.4g}",
                   peak_mem_max_gib=f"{max(m for m, _ in per_rank):.4g}" if cuda else "",
                   peak_mem_by_rank=";".join(f"{m:.4g}" for m, _ in per_rank) if cuda else "",
                   # a replayed CUDA graph has no event between backward and the optimizer: not measured
                   optimizer_s=f"{max(o for _, o in per_rank):.4g}" if rec.optimizer_start is not None else "",
                   bubble_frac=f"{bubble:.4g}" if bubble is not None else "",
                   end_unix_s=f"{time.time():.3f}")
        if self.rank0:
            print(" ".join(f"{k} {v}" for k, v in row.items() if k != "end_unix_s"), flush=True)
            if self.writer:
                self._write_row(row)
        supervise.progress(rec.step)  # the launcher's monitor: this rank is not stuck
        return self.stop.agreed()  # SIGTERM / SIGINT on any rank: every rank stops after the same step

    def _write_row(self, row: dict) -> None:
        """Append a step's row to the results CSV; a write error (a full disk) is one sentence naming the step to
        resume from."""
        try:
            self.writer.writerow(row)
            self.results.flush()
        except OSError as e:
            where = (f"resume from step {self.last_saved} with --resume" if self.last_saved is not None
                     else "no checkpoint was saved yet")
            raise PlanError(f"writing step {row['step']}'s row to the results file '{self.results.name}' failed "
                            f"({e.strerror or e}); {where}") from None

    def close(self) -> None:
        if self.results:
            try:
                self.results.close()
            except OSError:  # the write error was reported when it happened
                pass


def _open_results(path: Path):
    """Rank 0's step CSV, opened for appending: (file, csv.DictWriter). A new or empty file gets CSV_FIELDS as
    its header; a resumed run's file keeps its own header (one written before a column was added)."""
    new = not path.exists() or path.stat().st_size == 0
    fields = CSV_FIELDS
    if not new:
        with open(path, newline="") as fh:
            fields = next(csv.reader(fh), None) or CSV_FIELDS
    _end_with_newline(path)  # a row glued onto an unterminated last line would be lost
    results = open(path, "a", newline="")
    writer = csv.DictWriter(results, fieldnames=fields, extrasaction="ignore")
    if new:
        writer.writeheader()
    return results, writer


@dataclass
class Trainer:
    """One rank's training state for one plan, made by `build_trainer`: the stages and optimizer, the step
    function (a CUDA graph where the plan allows one), the prefetched data, the step log and the step that
    training starts from (0, or the checkpoint's step on --resume)."""
    plan: Plan
    args: object
    groups: object
    cuda: bool
    local_rank: int
    stages: list
    opt: object
    settings: OptimizerSettings
    plan_hash: str
    """sha256 of the plan's JSON, saved with every checkpoint."""
    start: int
    step_fn: object
    graphed: object | None
    """The GraphedStep when step_fn replays a CUDA graph, else None."""
    prefetch: Prefetcher
    clock: _Clock
    log: StepLog

    @property
    def queue_ahead(self) -> bool:
        """Whether one step stays queued ahead: step N+1 is launched before step N's numbers are read back, so
        the host launches N+1's first kernels while the GPU still runs N's optimizer, rather than the GPU idling
        at every step start until the host catches up. Pipelines (their timeline is read back per step) are
        read back at once, unless replayed as a CUDA graph; so are traced and checkpointed steps."""
        return self.plan.layout.pp == 1 or self.graphed is not None

    def save(self, step: int) -> None:
        """A checkpoint of `step` in --ckpt-dir (every rank calls it)."""
        checkpoint.save(self.args.ckpt_dir, step, self.opt, self.groups, self.settings, self.plan_hash)

    def save_hf(self, step: int, final: bool) -> None:
        """With --save-hf, the weights as a Hugging Face checkpoint (every rank calls it): in --save-hf at the end
        of the run, in --save-hf-stepNNNNNN at a --save-every step."""
        if not self.args.save_hf:
            return
        from runtime.hf import save_hf_weights
        out = self.args.save_hf if final else f"{self.args.save_hf}-step{step:06d}"
        config = self.args.hf_config or str(Path(self.args.init_from) / "config.json")
        save_hf_weights(self.stages, self.plan, self.groups, out, config)

    def close(self) -> None:
        """Stop the prefetcher, close the step CSV and release the optimizer."""
        self.prefetch.close()
        self.log.close()
        self.opt.close()


def build_trainer(plan: Plan, args, groups, cuda: bool, local_rank: int, results_path: str | None) -> Trainer:
    """The build part of the trainer: this rank's stages with the plan's recompute, the optimizer at the plan's
    sharding level, the checkpoint's state on --resume, the step function, the data prefetcher and the step log.

    Raises:
        PlanError: one sentence when the plan's FP8 needs a GPU this one is not, or the checkpoint cannot load.
    """
    spec, lay, shape = plan.model, plan.layout, plan.training
    source = open_source(args.data, spec.vocab_size, shape.seq_len, args.data_dtype, seed=args.seed)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if lay.fp8:
        from runtime.parallel.fp8 import check_fp8_device
        why = check_fp8_device(device)
        if why:
            raise PlanError(why)
    stages = build_rank_stages(plan, groups, device, lay.overlap_tp, args.seed, args.compile)
    if args.init_from:  # before the optimizer takes its fp32 master copy of the weights
        from runtime.hf import load_hf_weights
        load_hf_weights(stages, plan, groups, args.init_from)
    compute = torch.bfloat16 if cuda else torch.float32
    settings = optimizer_settings(args)
    adam = AdamConfig(lr=settings.schedule.peak_lr, weight_decay=settings.weight_decay, grad_clip=settings.clip_grad)
    opt = build_optimizer(stages, groups, lay.sharding, adam, compute, lay.overlap_dp,
                          grad_dtype=GRAD_DTYPES[lay.grad_dtype])
    plan_hash = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    start = _resume(args, opt, groups, results_path) if args.resume else 0
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
    clock = _Clock(cuda)
    log = StepLog(plan, args, groups, cuda, results_path, clock, _StopFlag())
    return Trainer(plan=plan, args=args, groups=groups, cuda=cuda, local_rank=local_rank, stages=stages, opt=opt,
                   settings=settings, plan_hash=plan_hash, start=start, step_fn=step_fn, graphed=graphed,
                   prefetch=prefetch, clock=clock, log=log)


def _resume(args, opt, groups, results_path: str | None) -> int:
    """Load the newest complete checkpoint of --ckpt-dir into `opt` and return its step. Rank 0 says where it
    resumed from, names incomplete saves it skipped, and sets aside the step CSV's rows after that step."""
    start = checkpoint.load(args.ckpt_dir, opt, groups)
    supervise.progress(start)
    if dist.get_rank() == 0:
        print(f"resumed from {checkpoint.step_dir(args.ckpt_dir, start)}", flush=True)
        for leftover in checkpoint.incomplete_leftovers(args.ckpt_dir):
            print(f"note: skipped '{leftover}', left incomplete by an interrupted save", flush=True)
        if results_path:
            set_aside_rows_after(Path(results_path), start)
    return start


def launch_step(t: Trainer, step: int, profiled: bool, memory: bool, queued_behind) -> _LaunchedStep:
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
    return _LaunchedStep(step + 1, numbers, peak_gib, wait, lr,
                         queued_behind if queued_behind is not None else start_mark,
                         opt_marks[0] if opt_marks else None, clock.mark(), replayed=replayed)


@dataclass
class RunOutcome:
    """How the step loop ended."""
    done: int
    """The last step completed (the start step when none ran)."""
    stopped: bool
    """A signal asked the run to stop."""
    last_saved: int | None
    """The step of the newest checkpoint this run saved or resumed from; None when there is none."""


def run_steps(t: Trainer) -> RunOutcome:
    """Train --steps steps from t.start: launch each step (`launch_step`), record it (`StepLog.record`) one step
    later where the trainer queues ahead, save every --save-every steps, and stop after the step at which any
    rank was signalled. Every rank runs the same sequence of collectives."""
    args, rank0 = t.args, dist.get_rank() == 0
    start = t.start
    pending: _LaunchedStep | None = None
    done, stopped = start, False
    last_saved = t.log.last_saved = start if args.resume else None
    for step in range(start, start + args.steps):
        if step > start and (step - start) % GC_EVERY_STEPS == 0:
            gc.collect()
        profiled = args.trace_step == step + 1
        memory = t.cuda and args.memory_step == step + 1 and bool(args.memory_out)
        traced = profiled or memory  # a profiled or memory-recorded step runs alone, not queued
        stopped = False
        if pending is not None and traced:
            stopped, pending = t.log.record(pending), None
            if stopped:
                break
        rec = launch_step(t, step, profiled, memory, pending.end if pending is not None else None)
        done = step + 1
        if pending is not None:
            stopped, pending = t.log.record(pending), None
        save_due = bool(args.ckpt_dir and args.save_every and done % args.save_every == 0)
        if t.queue_ahead and not (traced or save_due or stopped):
            pending = rec
            continue
        stopped = t.log.record(rec) or stopped
        if save_due:
            if t.graphed is not None:
                t.graphed.sync_params()
            t.save(done)
            t.save_hf(done, final=False)
            supervise.progress()
            last_saved = t.log.last_saved = done
        if stopped:
            if rank0:
                print(f"stopping after step {done} (signal)", flush=True)
            break
    if pending is not None:
        if t.log.record(pending):
            stopped = True
            if rank0:
                print(f"stopping after step {done} (signal)", flush=True)
    return RunOutcome(done=done, stopped=stopped, last_saved=last_saved)


def finish_run(t: Trainer, outcome: RunOutcome, components_path: str | None) -> None:
    """After the step loop: the exit checkpoint (unless the last step was just saved), then with components_path
    and no stop signal one traced step more (write_step_components). That extra step comes after the exit
    checkpoint, which holds step `done`: its update is never saved or logged, so neither a resumed run nor the
    step statistics see it."""
    done = outcome.done
    if t.graphed is not None:
        t.graphed.sync_params()
    if t.args.ckpt_dir and outcome.last_saved != done:
        t.save(done)  # at exit
    t.save_hf(done, final=True)
    if components_path and not outcome.stopped:
        mbs = t.prefetch.next()[0]  # fetched before the trace: its host-to-device copy is not the step's
        lr = t.settings.schedule.at(done)
        write_step_components(components_path, t.cuda, done + 1,
                              lambda: t.step_fn(t.stages, mbs, t.opt, t.groups, lr))


def train_plan(plan: Plan, args, groups, cuda: bool, local_rank: int, results_path: str | None,
               components_path: str | None = None) -> None:
    """Train `plan` for args.steps steps on this rank (every rank calls it): build the trainer, run the steps,
    save at exit; with components_path, then one traced step more (write_step_components).

    Python's cyclic garbage collector would pause the host at unpredictable points, and a paused host leaves the
    GPU idle in a launch-bound step; it runs between steps instead, every GC_EVERY_STEPS (as Megatron-LM's manual
    GC does). Objects alive once the trainer is built (the model, the optimizer) are frozen out of its scans.
    """
    t = build_trainer(plan, args, groups, cuda, local_rank, results_path)
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        outcome = run_steps(t)
        finish_run(t, outcome, components_path)
    finally:
        gc.enable()
        gc.unfreeze()
        t.close()


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
        # own, as in a fresh process, and its peak counts them as the planner does (planner/memory/model.py)
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
