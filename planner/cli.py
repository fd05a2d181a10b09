"""`plan`: the command line. `plan --model M --gpus N` searches; subcommands profile, launch, validate,
scaling and export hand over to their modules (the runtime ones import torch, the planner never does).

Every user error ends as one sentence on stderr and a non-zero exit: 1 for bad input, 2 when no layout
fits in memory.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
import warnings

from planner.errors import PlanError
from planner.limits import (MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NETWORK_GB_PER_S, MAX_SEQ_LEN,
                            MAX_STEPS, float_arg, int_arg)

SUBCOMMANDS = {
    "profile": ("runtime.profiler.cli", "time this machine's kernels and collectives into a profile"),
    "launch": ("runtime.launch", "train from a plan file (torchrun underneath)"),
    "validate": ("runtime.validate", "run a plan for a few steps and compare with its prediction"),
    "calibrate": ("planner.calibrate", "refit a profile's overlap fractions from measured runs"),
    "scaling": ("planner.scaling", "strong / weak scaling report over GPU counts"),
    "export": ("planner.export", "a plan as Megatron-LM arguments, a torchrun command or a Slurm script"),
}


def _positive_int(name, hi=MAX_STEPS):
    return int_arg(name, 1, hi)


def _positive_float(name, hi=math.inf):
    return float_arg(name, 0.0, hi)


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


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, exit 1 (argparse's default is a usage dump and exit 2)
        message = re.sub(r"^argument (\S+): (?=\1 )", "", message)  # "argument --gpus: --gpus must be ..."
        raise PlanError(f"{message} (see `{self.prog} --help`)")


def add_model_cluster_args(ap: argparse.ArgumentParser, gpus_required: bool = True) -> None:
    from planner.cluster import GPU_KINDS

    ap.add_argument("--model", required=True, help="catalogue name (e.g. gpt-70b, llama3-8b) or a Hugging Face config.json")
    if gpus_required:
        ap.add_argument("--gpus", type=_positive_int("--gpus", MAX_GPUS), help=f"number of GPUs (at most {MAX_GPUS})")
    ap.add_argument("--gpu", default="h200-sxm", choices=sorted(GPU_KINDS), help="GPU kind (default h200-sxm)")
    ap.add_argument("--gpus-per-node", type=_positive_int("--gpus-per-node", MAX_GPUS_PER_NODE), default=8, help="default 8")
    ap.add_argument("--inter-node-gbps", type=_positive_float("--inter-node-gbps", MAX_NETWORK_GB_PER_S), default=50.0,
                    help="network bandwidth per GPU in GB/s, one direction (default 50 = 400 Gb/s NDR)")
    ap.add_argument("--headroom-gib", type=float_arg("--headroom-gib", 0.0, 1e6, lo_open=False), default=None,
                    help="memory per GPU to leave free below the planner's allowance (default 5%% of the GPU's "
                         "memory; 0 plans to the allowance's edge)")
    ap.add_argument("--cluster", help="JSON file with the whole cluster description (overrides the above)")
    ap.add_argument("--profile", help="profile JSON (default: the one shipped for --gpu)")
    ap.add_argument("--allow-other-gpu-profile", action="store_true",
                    help="accept a profile measured on another GPU kind than the cluster's (refused otherwise)")
    ap.add_argument("--seq-len", type=_positive_int("--seq-len", MAX_SEQ_LEN), help="tokens per sequence (default: the model's)")
    ap.add_argument("--global-batch", type=_positive_int("--global-batch", MAX_GLOBAL_BATCH),
                    help="sequences per step (default: the model's, e.g. 1024 for GPT, 512 for Llama 3)")


def add_runtime_arg(ap: argparse.ArgumentParser) -> None:
    """--runtime: the training runtime the prediction is for (planner/cost/targets.py)."""
    from planner.plan import RUNTIME_TARGETS

    ap.add_argument("--runtime", choices=list(RUNTIME_TARGETS), default="ours",
                    help="predict for this runtime: ours (default; runtime/) or megatron (Megatron-Core with "
                         "Transformer Engine, eager, its TP/DP overlap; factors fitted on published runs)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="plan", description="Recommend how to split a model's training across GPUs. "
                 "Subcommands: " + ", ".join(f"{k} ({v[1]})" for k, v in SUBCOMMANDS.items()), epilog=EXIT_CODES)
    ap.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and git commit, and exit")
    add_model_cluster_args(ap)
    pins = ap.add_argument_group("pins (fix a dimension; the search does the rest)")
    for name in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro-batch"):
        pins.add_argument(f"--{name}", type=_positive_int(f"--{name}", MAX_GLOBAL_BATCH if name == "micro-batch" else MAX_GPUS))
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
    ap.add_argument("--top", type=_positive_int("--top", 1000), default=4, help="plans to show (default 4)")
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


def resolve_inputs(args):
    """(model, cluster, training shape, profile) from parsed arguments; every check in one place."""
    from dataclasses import replace

    from planner.cluster import ClusterSpec, load_cluster_file, validate_cluster
    from planner.model import resolve_model
    from planner.plan import TrainingShape
    from planner.profile import load_profile

    model = resolve_model(args.model)
    if args.cluster:
        cluster = load_cluster_file(args.cluster)
        if getattr(args, "gpus", None):
            cluster = replace(cluster, num_gpus=args.gpus)
    else:
        if getattr(args, "gpus", None) is None:
            raise PlanError("--gpus is required (or give --cluster with num_gpus)")
        cluster = ClusterSpec(gpu=args.gpu, num_gpus=args.gpus, gpus_per_node=args.gpus_per_node,
                              inter_node_gb_per_s=args.inter_node_gbps, memory_headroom_gib=args.headroom_gib)
    if cluster.num_gpus < cluster.gpus_per_node:
        cluster = replace(cluster, gpus_per_node=cluster.num_gpus)
    validate_cluster(cluster)
    seq = args.seq_len or model.default_seq_len
    gb = args.global_batch or model.default_global_batch
    if seq > model.max_seq_len:
        raise PlanError(f"--seq-len {seq} exceeds {model.name}'s maximum of {model.max_seq_len} tokens")
    shape = TrainingShape(seq_len=seq, global_batch=gb)
    profile = load_profile(args.profile, cluster.gpu, other_gpu_ok=getattr(args, "allow_other_gpu_profile", False))
    return model, cluster, shape, profile


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
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        if argv and argv[0] in SUBCOMMANDS:
            import importlib

            module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
            return int(module.main(argv[1:]) or 0)
        return run_plan(argv)
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            print("plan: this command needs PyTorch; install the runtime extra: pip install 'parallel-plan[runtime]'",
                  file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
