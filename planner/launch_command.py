"""The `plan launch` command line and the torchrun command it runs: plain argument handling with no torch,
shared by runtime/launch.py (which runs it) and planner/export.py (which prints it), so both stay one."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.errors import PlanError
from planner.limits import MAX_GPUS, MAX_GPUS_PER_NODE, MAX_STEPS, MAX_TFLOPS, float_arg, int_arg
from planner.lr_schedule import add_options as add_optimizer_options
from planner.lr_schedule import add_resume_option
from planner.lr_schedule import from_args as optimizer_settings
from planner.lr_schedule import to_argv as optimizer_argv

WORKER_ERROR_FILE_ENV = "PLAN_LAUNCH_ERROR_FILE"
"""Environment variable naming the file where a worker that stops on bad input writes its exit code and
sentence, for `plan launch` to print once (rather than every rank printing it above torchrun's traceback)."""


def _flag_definitions() -> dict[str, dict]:
    """`plan launch`'s flags as add_argument keywords: each type carries its range check, so the launcher, its
    workers and `plan export` refuse a bad value with the same sentence."""
    return {
        "--steps": dict(type=int_arg("--steps", 1, MAX_STEPS), default=10,
                        help="training steps to run (after --resume: more steps; default 10)"),
        "--device": dict(choices=["cpu", "cuda"], default="cuda",
                         help="cuda (default; one process per GPU) or cpu (gloo, for trying a plan without GPUs)"),
        "--data": dict(default="synthetic",
                       help="synthetic, a token file, a Megatron .bin/.idx prefix, or W1:SRC1,W2:SRC2 blends"),
        "--data-dtype": dict(choices=["uint16", "uint32"], default=None,
                             help="token width of a flat token file (default: uint16 when the vocabulary fits, "
                                  "else uint32)"),
        "--ckpt-dir": dict(default=None, help="folder of distributed checkpoints (torch.distributed.checkpoint)"),
        "--save-every": dict(type=int_arg("--save-every", 0, MAX_STEPS), default=0,
                             help="save a checkpoint every N steps (default 0: only at exit); needs --ckpt-dir"),
        "--resume": dict(action="store_true",
                         help="continue from the newest complete checkpoint in --ckpt-dir (under this or another "
                              "plan)"),
        "--results": dict(default=None, help="CSV of per-step results (default: beside the plan)"),
        "--peak-tflops": dict(type=float_arg("--peak-tflops", 0.0, MAX_TFLOPS), default=989.0,
                              help="per-GPU dense bf16 peak used for MFU"),
        "--compile": dict(action="store_true", help="torch.compile each transformer layer"),
        "--memory-step": dict(type=int_arg("--memory-step", 0, MAX_STEPS), default=0,
                              help="record the CUDA allocator during this step (1-based) and write what is alive "
                                   "at its peak"),
        "--memory-out": dict(default=None, help="prefix of --memory-step's files: PREFIX.rank<r>.json"),
        "--init-from": dict(default=None, metavar="DIR",
                            help="start from the Hugging Face checkpoint in DIR (config.json and safetensors, one "
                                 "file or sharded with its index); each rank reads only the slices it holds"),
        "--save-hf": dict(default=None, metavar="DIR",
                          help="write the trained weights as a Hugging Face checkpoint to DIR at the end, and to "
                               "DIR-stepNNNNNN at every --save-every"),
        "--hf-config": dict(default=None, metavar="CONFIG",
                            help="the model's Hugging Face config.json that --save-hf writes beside the weights "
                                 "(default: --init-from's)"),
        "--nproc-per-node": dict(type=int_arg("--nproc-per-node", 1, MAX_GPUS_PER_NODE), default=None,
                                 help="processes on this node (default: the plan's world size / --nnodes)"),
        "--nnodes": dict(type=int_arg("--nnodes", 1, MAX_GPUS), default=1, help="nodes taking part (default 1)"),
        "--node-rank": dict(type=int_arg("--node-rank", 0, MAX_GPUS), default=0,
                            help="this node's rank among --nnodes (default 0)"),
        "--rdzv-endpoint": dict(default=None, help="host:port of the rendezvous (several nodes)"),
    }


LR_AND_ADAMW = "lr-and-adamw"
"""In a list of flags for `add_launch_flags`: the learning-rate schedule and AdamW options, as
planner/lr_schedule.py declares them (add_options)."""

WORKER_FLAGS = ("--steps", "--device", "--data", "--data-dtype", "--ckpt-dir", "--save-every", "--resume",
                "--override-lr-schedule", "--results", "--peak-tflops", LR_AND_ADAMW, "--compile", "--memory-step",
                "--memory-out", "--init-from", "--save-hf", "--hf-config")
"""The flags `plan launch` passes on to every worker (runtime.train), besides the plan file(s)."""

NODE_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint")
"""The flags that place `plan launch`'s processes on nodes (torchrun's, not the workers')."""


def add_launch_flags(ap: argparse.ArgumentParser, names, help: dict[str, str] | None = None) -> None:
    """Add `plan launch`'s flags `names` to `ap`, each with `plan launch`'s type, range check and default.

    Args:
        ap: the parser.
        names: flags of `plan launch`, in the order to add them; "--override-lr-schedule" and LR_AND_ADAMW
            come from planner/lr_schedule.py.
        help: another help text for some of the flags, where a command forwards them with its own words.
    """
    flags = _flag_definitions()
    for name in names:
        if name == "--override-lr-schedule":
            add_resume_option(ap)
        elif name == LR_AND_ADAMW:
            add_optimizer_options(ap)
        else:
            kwargs = dict(flags[name])
            if help and name in help:
                kwargs["help"] = help[name]
            ap.add_argument(name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """`plan launch`'s parser: the plan file, the workers' flags, the node flags, --timeout and --dry-run."""
    from planner.arguments import Parser  # argparse errors as one sentence, exit 1

    ap = Parser(prog="plan launch", description="Train from a plan (torchrun underneath).")
    ap.add_argument("plan", help="plan.json written by `plan -o`")
    add_launch_flags(ap, WORKER_FLAGS + NODE_FLAGS)
    ap.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="end the job when a rank shows no sign of life for half this long, or no rank finishes a "
                         "step (or save) for this long (default 300); one sentence names the rank, the step and "
                         "the checkpoint to resume from")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the torchrun command (quoted for a shell) and exit")
    return ap


def torchrun_command(args, nproc: int, results: Path, plans: list[str] | None = None,
                     components: Path | None = None) -> list[str]:
    """The torchrun command for args.plan, or for several `plans` run one after another by one worker
    (`results` is then a folder). `components` (plan validate): the workers' --components-out, a file, or a
    folder with several plans."""
    if not 0 <= args.node_rank < args.nnodes:
        raise PlanError(f"--node-rank {args.node_rank} is not one of the {args.nnodes} node(s) 0..{args.nnodes - 1}")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={args.nnodes}"]
    if args.nnodes > 1:
        if not args.rdzv_endpoint:
            raise PlanError("a launch on several nodes needs --rdzv-endpoint host:port")
        cmd += [f"--node-rank={args.node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
    else:
        cmd += ["--standalone"]
    cmd += ["-m", "runtime.train", "--plan", *(plans or [str(args.plan)]), "--steps", str(args.steps), "--device", args.device,
            "--data", args.data, "--results", str(results), "--peak-tflops", str(args.peak_tflops),
            *optimizer_argv(optimizer_settings(args))]
    if args.data_dtype:
        cmd += ["--data-dtype", args.data_dtype]
    if args.ckpt_dir:
        cmd += ["--ckpt-dir", args.ckpt_dir, "--save-every", str(args.save_every)]
    if args.resume:
        cmd += ["--resume"]
    if args.override_lr_schedule:
        cmd += ["--override-lr-schedule"]
    if args.compile:
        cmd += ["--compile"]
    if getattr(args, "memory_step", 0):
        cmd += ["--memory-step", str(args.memory_step), "--memory-out", str(args.memory_out)]
    for flag in ("init_from", "save_hf", "hf_config"):
        if getattr(args, flag, None):
            cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if components is not None:
        cmd += ["--components-out", str(components)]
    return cmd
