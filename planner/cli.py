"""`plan`: the command line. `plan --model M --gpus N` searches; subcommands profile, launch, validate,
scaling and export hand over to their modules (the runtime ones import torch, the planner never does).

Every user error ends as one sentence on stderr and a non-zero exit: 1 for bad input, 2 when no layout
fits in memory.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

from planner.errors import PlanError

SUBCOMMANDS = {
    "profile": ("runtime.profiler.cli", "time this machine's kernels and collectives into a profile"),
    "launch": ("runtime.launch", "train from a plan file (torchrun underneath)"),
    "validate": ("runtime.validate", "run a plan for a few steps and compare with its prediction"),
    "calibrate": ("planner.calibrate", "refit a profile's overlap fractions from measured runs"),
    "scaling": ("planner.scaling", "strong / weak scaling report over GPU counts"),
    "export": ("planner.export", "a plan as Megatron-LM arguments, a torchrun command or a Slurm script"),
}


def _positive_int(name):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got '{s}'") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {v}")
        return v
    return parse


def _positive_float(name):
    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got '{s}'") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {v}")
        return v
    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, exit 1 (argparse's default is a usage dump and exit 2)
        raise PlanError(f"{message} (see `{self.prog} --help`)")


def add_model_cluster_args(ap: argparse.ArgumentParser, gpus_required: bool = True) -> None:
    from planner.cluster import GPU_KINDS

    ap.add_argument("--model", required=True, help="catalogue name (e.g. gpt-70b, llama3-8b) or a Hugging Face config.json")
    if gpus_required:
        ap.add_argument("--gpus", type=_positive_int("--gpus"), help="number of GPUs")
    ap.add_argument("--gpu", default="h200-sxm", choices=sorted(GPU_KINDS), help="GPU kind (default h200-sxm)")
    ap.add_argument("--gpus-per-node", type=_positive_int("--gpus-per-node"), default=8, help="default 8")
    ap.add_argument("--inter-node-gbps", type=_positive_float("--inter-node-gbps"), default=50.0,
                    help="network bandwidth per GPU in GB/s, one direction (default 50 = 400 Gb/s NDR)")
    ap.add_argument("--headroom-gib", type=float, default=0.0,
                    help="memory per GPU to leave free beyond the planner's allowance (default 0)")
    ap.add_argument("--cluster", help="JSON file with the whole cluster description (overrides the above)")
    ap.add_argument("--profile", help="profile JSON (default: the one shipped for --gpu)")
    ap.add_argument("--seq-len", type=_positive_int("--seq-len"), help="tokens per sequence (default: the model's)")
    ap.add_argument("--global-batch", type=_positive_int("--global-batch"),
                    help="sequences per step (default: the model's, e.g. 1024 for GPT, 512 for Llama 3)")


def add_runtime_arg(ap: argparse.ArgumentParser) -> None:
    """--runtime: the training runtime the prediction is for (planner/cost/targets.py)."""
    from planner.plan import RUNTIME_TARGETS

    ap.add_argument("--runtime", choices=list(RUNTIME_TARGETS), default="ours",
                    help="predict for this runtime: ours (default; runtime/) or megatron (Megatron-Core with "
                         "Transformer Engine, eager, its TP/DP overlap; factors fitted on published runs)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="plan", description="Recommend how to split a model's training across GPUs. "
                 "Subcommands: " + ", ".join(f"{k} ({v[1]})" for k, v in SUBCOMMANDS.items()))
    add_model_cluster_args(ap)
    pins = ap.add_argument_group("pins (fix a dimension; the search does the rest)")
    for name in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro-batch"):
        pins.add_argument(f"--{name}", type=_positive_int(f"--{name}"))
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
    ap.add_argument("--top", type=_positive_int("--top"), default=4, help="plans to show (default 4)")
    ap.add_argument("--why-not", action="store_true",
                    help="also show the best plan of each other kind of layout (other TP degrees, no pipeline, "
                         "other sharding levels, CP, EP) and where it loses time (about half a second more)")
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
    profile = load_profile(args.profile, cluster.gpu)
    return model, cluster, shape, profile


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
        if Path(args.output).exists() and not args.force:
            raise PlanError(f"'{args.output}' already exists; pass --force to overwrite it")
    from planner.cost.targets import load_target

    target = load_target(args.runtime)
    result = search(model, shape, cluster, profile, pins, top_k=args.top, alternatives=args.why_not, target=target)
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
