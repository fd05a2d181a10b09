"""The training worker that `plan launch` starts under torchrun (one process per GPU).

    python -m torch.distributed.run --nproc-per-node N -m runtime.train --plan plan.json [...]

Parses and checks the worker's arguments, builds the process groups, then for each plan runs a trainer
(runtime/trainer/, `train_plan`) in parts, as torchtitan's is:
- build (`build_trainer`, trainer/build.py): this rank's pipeline stage(s) with the plan's recompute, the optimizer
  at the plan's sharding level, the checkpoint's state on --resume, the step function, the data prefetcher, the
  step log;
- step (`launch_step`, trainer/step.py): the next step's micro-batches (prefetched) through `train_step`, queued on
  the device;
- log (`StepLog.record`, trainer/log.py): the step read back, rank 0 printing one line and appending it to the
  results CSV (trainer/results_csv.py).
`run_steps` (trainer/loop.py) runs the loop (one step queued ahead, checkpoints every --save-every steps, a signal
stops every rank after the same step) and `finish_run` saves at exit. With --components-out (plan validate),
one extra step after the last runs under torch.profiler and every rank's GPU compute, exposed communication
and idle time go to a JSON file (trainer/components.py); that step is not logged and comes after the exit
checkpoint. A PlanError is one sentence (`report_error`), never a traceback.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":  # a worker: bound to its parent and beating before the seconds of heavy imports below
    from runtime.supervise import arm_worker
    arm_worker()

import torch
import torch.distributed as dist

from planner.errors import PlanError
from planner.launch_command import WORKER_ERROR_FILE_ENV
from planner.lr_schedule import from_args as optimizer_settings
from planner.plan import Plan
from runtime import checkpoint, supervise
from runtime.mesh import build_groups
from runtime.trainer.build import build_rank_stages, build_trainer  # noqa: F401 (re-exported)
from runtime.trainer.components import NOT_TRACED_ON_CPU, write_step_components  # noqa: F401 (re-exported)
from runtime.trainer.log import StepLog  # noqa: F401 (re-exported)
from runtime.trainer.loop import finish_run, run_steps, train_plan  # noqa: F401 (finish_run, run_steps re-exported)
from runtime.trainer.results_csv import CSV_FIELDS, _end_with_newline, set_aside_rows_after  # noqa: F401 (re-exported)
from runtime.trainer.step import launch_step  # noqa: F401 (re-exported)


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
