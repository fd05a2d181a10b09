"""`plan`: the command line. `plan --model M --gpus N` searches; subcommands profile, launch, validate,
scaling and export hand over to their modules (the runtime ones import torch, the planner never does).

Every user error ends as one sentence on stderr and a non-zero exit: 1 for bad input, 2 when no layout
fits in memory. The argument types, the parser and the model / cluster arguments that the subcommands share live in
planner/arguments.py: this module is the top of the import graph, and no other module imports it.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from planner.arguments import (Parser, add_model_cluster_args, add_runtime_arg, positive_int,
                               resolve_inputs, run_command)
from planner.errors import PlanError
from planner.limits import MAX_GLOBAL_BATCH, MAX_GPUS

SUBCOMMANDS = {
    "profile": ("runtime.profiler.cli", "time this machine's kernels and collectives into a profile"),
    "launch": ("runtime.launch", "train from a plan file (torchrun underneath)"),
    "validate": ("runtime.validate", "run a plan for a few steps and compare with its prediction"),
    "calibrate": ("planner.calibrate", "refit a profile's overlap fractions from measured runs"),
    "scaling": ("planner.scaling", "strong / weak scaling report over GPU counts"),
    "export": ("planner.export", "a plan as Megatron-LM arguments, a torchrun command or a Slurm script"),
}

EXIT_CODES = ("exit codes: 0 done; 1 bad input (one sentence on stderr, nothing written); 2 no layout fits in memory "
              "(the sentence names the binding constraint); 130 interrupted; plan launch / validate: 128+N stopped "
              "by signal N, and a training run's own exit code where it failed otherwise")


def version_text() -> str:
    """`plan --version`: the package version and the git commit of this tree where there is one."""
    from importlib import metadata

    from planner.provenance import UNAVAILABLE, git_commit

    try:
        version = metadata.version("parallel-plan")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    c = git_commit(short=True)
    commit = "unknown" if c["git_commit"] == UNAVAILABLE else c["git_commit"] + ("+dirty" if c["git_dirty"] else "")
    return f"parallel-plan {version} (commit {commit})"


class _VersionAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):  # git runs only when asked
        print(version_text())
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="plan", description="Recommend how to split a model's training across GPUs. "
                 "Subcommands: " + ", ".join(f"{k} ({v[1]})" for k, v in SUBCOMMANDS.items()), epilog=EXIT_CODES)
    ap.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and git commit, and exit")
    add_model_cluster_args(ap)
    pins = ap.add_argument_group("pins (fix a dimension; the search does the rest)")
    for name in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro-batch"):
        pins.add_argument(f"--{name}", type=positive_int(f"--{name}", MAX_GLOBAL_BATCH if name == "micro-batch" else MAX_GPUS))
    pins.add_argument("--recompute", choices=["none", "selective", "full"])
    pins.add_argument("--sharding", choices=["none", "optimizer", "optimizer+grads", "full"])
    pins.add_argument("--fp8", action="store_true",
                      help="the transformer layers' forward and input-gradient GEMMs in FP8 (Ada / Hopper and newer)")
    pins.add_argument("--grad-dtype", choices=["fp32", "bf16"], default="fp32",
                      help="precision of the main gradients and their data-parallel reduction (default fp32; bf16 "
                           "halves both, as Megatron-LM without --accumulate-allreduce-grads-in-fp32)")
    pins.add_argument("--no-cuda-graph", action="store_true",
                      help="run every plan's step eagerly instead of as a replayed CUDA graph where one is legal")
    pins.add_argument("--no-overlap", default="", metavar="DIMS",
                      help="comma list of tp, dp, pp, ep whose communication is not overlapped with compute "
                           "(ep: MoE tokens never dispatched in overlapped chunks)")
    add_runtime_arg(ap)
    ap.add_argument("--top", type=positive_int("--top", 1000), default=4, help="plans to show (default 4)")
    ap.add_argument("--why-not", action="store_true",
                    help="also show the best plan of each other kind of layout (other TP degrees, no pipeline, "
                         "other sharding levels, CP, EP) and where it loses time (about half a second more)")
    ap.add_argument("--exact", action="store_true",
                    help="prove the best plan: evaluate every layout whose lower bound is below the best step (slower; "
                         "the default evaluates the most promising layouts and says whether its best is proven)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("-o", "--output", help="write the best plan to this file")
    ap.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    return ap


def check_pins(pins, shape, num_gpus: int) -> None:
    """Pins that no layout can meet, refused with the reason (not the search's "no layout exists"): degrees whose
    product does not divide the GPUs, a global batch that is not whole micro-batches on every replica."""
    given = {k: getattr(pins, k) for k in ("tp", "pp", "cp", "dp") if getattr(pins, k)}
    product = math.prod(given.values())
    named = " x ".join(f"{k} {v}" for k, v in given.items())
    if given and num_gpus % product:
        raise PlanError(f"the pinned {named} = {product} does not divide the {num_gpus} GPUs")
    if len(given) == 4 and product != num_gpus:
        raise PlanError(f"the pinned {named} = {product} GPUs, not the {num_gpus} asked for")
    dp, mb = pins.dp or 1, pins.micro_batch or 1
    if shape.global_batch % (dp * mb):
        what = " x ".join(([f"dp {pins.dp}"] if pins.dp else []) + ([f"micro-batch {pins.micro_batch}"] if pins.micro_batch else []))
        raise PlanError(f"the global batch {shape.global_batch} is not a multiple of {what}"
                        + (f" = {dp * mb}" if pins.dp and pins.micro_batch else "")
                        + " (every data-parallel replica runs whole micro-batches)")


def run_plan(argv: list[str]) -> int:
    from planner.report import print_result, result_json
    from planner.search import Pins, search

    t0 = time.perf_counter()
    args = build_parser().parse_args(argv)
    model, cluster, shape, profile = resolve_inputs(args)
    no_overlap = frozenset(d.strip() for d in args.no_overlap.split(",") if d.strip())
    if no_overlap - {"tp", "dp", "pp", "ep"}:
        raise PlanError(f"--no-overlap takes tp, dp, pp and ep, not "
                        f"{', '.join(sorted(no_overlap - {'tp', 'dp', 'pp', 'ep'}))}")
    pins = Pins(tp=args.tp, pp=args.pp, vpp=args.vpp, dp=args.dp, cp=args.cp, ep=args.ep,
                micro_batch=args.micro_batch, sharding=args.sharding, recompute=args.recompute,
                no_overlap=no_overlap, fp8=args.fp8, grad_dtype=args.grad_dtype,
                cuda_graph=not args.no_cuda_graph)
    if args.output:
        from pathlib import Path

        from planner.outputs import check_output_file
        check_output_file(Path(args.output), "-o", overwrite=args.force)
    check_pins(pins, shape, cluster.num_gpus)
    from planner.cost.targets import load_target

    target = load_target(args.runtime)
    result = search(model, shape, cluster, profile, pins, top_k=args.top, alternatives=args.why_not, target=target,
                    exact=args.exact)
    elapsed = time.perf_counter() - t0
    if args.output:
        from pathlib import Path
        result.plans[0].save(Path(args.output), overwrite=args.force)
    if args.json:
        print(result_json(result, elapsed, target))
    else:
        print_result(result, elapsed, why_not=args.why_not, target=target)
        if args.output:
            print(f"wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`plan ARGS`: a subcommand hands over to its module's main(argv), anything else searches (run_plan); every
    user error ends as one sentence and an exit code (planner.arguments.run_command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        module_name = SUBCOMMANDS[argv[0]][0]

        def subcommand(args: list[str]) -> int:
            import importlib  # imported only when asked: the runtime's modules import torch
            return importlib.import_module(module_name).main(args)

        return run_command(subcommand, argv[1:])
    return run_command(run_plan, argv)


if __name__ == "__main__":
    sys.exit(main())
