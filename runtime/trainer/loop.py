"""The trainer's run: the step loop (one step queued ahead, a checkpoint every --save-every steps, a signal
stopping every rank after the same step), the exit checkpoint and the --components-out step after it."""
from __future__ import annotations

import gc
from dataclasses import dataclass

import torch.distributed as dist

from planner.plan import Plan
from runtime import supervise
from runtime.trainer.build import Trainer, build_trainer
from runtime.trainer.components import write_step_components
from runtime.trainer.step import LaunchedStep, launch_step

GC_EVERY_STEPS = 50
"""Steps between the training loop's own garbage collections (automatic collection is off while it runs)."""


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
    pending: LaunchedStep | None = None
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
