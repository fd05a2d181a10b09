"""`plan launch plan.json ...`: check everything that can be checked on this machine, then start torchrun.

Checks (each failure is one sentence and a non-zero exit, before any GPU work): the plan loads and is
legal; its world size equals nproc-per-node x nnodes; CUDA and enough GPUs are present for --device cuda;
the data source opens and is long enough; the results CSV does not already exist (unless resuming).
Then runs `python -m torch.distributed.run ... -m runtime.train ...` (single node by default; several
nodes with --nnodes, --node-rank and --rdzv-endpoint) and returns its exit code.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from planner.errors import PlanError
from planner.launch_command import build_parser, torchrun_command  # noqa: F401 (re-exported)
from planner.plan import Plan


def check(args) -> tuple[Plan, int, Path]:
    plan, nproc = check_plan_on_machine(args)
    results = Path(args.results) if args.results else Path(args.plan).with_suffix(".results.csv")
    if results.exists() and not args.resume:
        raise PlanError(f"results file '{results}' already exists; move it away or pass --results")
    if args.resume and not args.ckpt_dir:
        raise PlanError("--resume needs --ckpt-dir")
    if args.save_every and not args.ckpt_dir:
        raise PlanError("--save-every needs --ckpt-dir")
    check_memory_trace(args, nproc)
    return plan, nproc, results


def check_memory_trace(args, nproc: int) -> None:
    """--memory-step / --memory-out: CUDA only, a step the run reaches, and no file of it already there."""
    step, prefix = getattr(args, "memory_step", 0), getattr(args, "memory_out", None)
    if not step and not prefix:
        return
    if not step or not prefix:
        raise PlanError("--memory-step and --memory-out go together")
    if args.device != "cuda":
        raise PlanError("--memory-step records the CUDA allocator; it needs --device cuda")
    if not 1 <= step <= args.steps:
        raise PlanError(f"--memory-step {step} is not one of the run's steps 1..{args.steps}")
    taken = [f"{prefix}.rank{r}.json" for r in range(nproc * args.nnodes) if Path(f"{prefix}.rank{r}.json").exists()]
    if taken:
        raise PlanError(f"'{taken[0]}' already exists; give another --memory-out")


def check_plan_on_machine(args) -> tuple[Plan, int]:
    """The checks that do not concern output files: plan, world size, GPUs, data source."""
    plan = Plan.load(Path(args.plan))
    world = plan.layout.world_size
    if args.nnodes < 1:
        raise PlanError(f"--nnodes must be at least 1, got {args.nnodes}")
    nproc = args.nproc_per_node if args.nproc_per_node is not None else world // args.nnodes
    if nproc < 1 or nproc * args.nnodes != world:
        raise PlanError(f"the plan needs {world} processes ({plan.layout.short()}) but the launch would start "
                        f"{max(nproc, 0) * args.nnodes} ({args.nnodes} node(s) x {max(nproc, 0)} per node)")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise PlanError("--device cuda was asked for but this machine has no usable CUDA GPU "
                            "(use --device cpu for a CPU run)")
        if torch.cuda.device_count() < nproc:
            raise PlanError(f"the plan puts {nproc} processes on this node but it has "
                            f"{torch.cuda.device_count()} GPU(s)")
        if plan.layout.fp8:
            from runtime.parallel.fp8 import check_fp8_device
            for i in range(nproc):
                why = check_fp8_device(f"cuda:{i}")
                if why:
                    raise PlanError(why)
    from runtime.data import open_source
    open_source(args.data, plan.model.vocab_size, plan.training.seq_len, args.data_dtype)
    return plan, nproc


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan, nproc, results = check(args)
        cmd = torchrun_command(args, nproc, results)
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    return subprocess.call(cmd, env=worker_env(args.device))


def worker_env(device: str) -> dict:
    """The environment torchrun's workers get: this repository importable, one OpenMP thread per CPU process."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


if __name__ == "__main__":
    sys.exit(main())
