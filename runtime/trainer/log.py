"""The log part of the trainer: a launched step read back, every rank's statistics gathered, rank 0 printing one
line and appending one row to the step CSV; the stop flag that every rank agrees on after each step."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import PlanError
from planner.plan import Plan
from runtime import supervise
from runtime.trainer.results_csv import open_results
from runtime.trainer.step import LaunchedStep, StepClock


class StopFlag:
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


class StepLog:
    """The log part of the trainer: reads a launched step back and records it.

    `record` waits for the step's work, gathers every rank's peak memory and optimizer time (and the pipeline's
    bubble), prints one line and appends one CSV row on rank 0, tells the launcher's monitor that this rank made
    progress, and returns whether any rank was asked to stop. Every rank calls it for every step, in the same
    order: it runs collectives.
    """

    def __init__(self, plan: Plan, args, groups, cuda: bool, results_path: str | None, clock: StepClock,
                 stop: StopFlag):
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
            self.results, self.writer = open_results(Path(results_path))

    def record(self, rec: LaunchedStep) -> bool:
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
