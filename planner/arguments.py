"""The command-line conventions every `plan` command shares: argument types with their range checks, the parser
whose errors are one sentence, the model / cluster arguments and their resolution into planner inputs, and the
exit that turns a user error into one sentence on stderr.

`plan` (planner/cli.py) and every subcommand's module build their parsers from these, so that planner/cli.py
sits on top of the import graph: nothing below it imports it.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import warnings

from planner.errors import PlanError
from planner.limits import (MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_NETWORK_GB_PER_S, MAX_SEQ_LEN,
                            MAX_STEPS, float_arg, int_arg)


def positive_int(name: str, hi: int = MAX_STEPS):
    """argparse type: a whole number in [1, hi], or one sentence naming the bound."""
    return int_arg(name, 1, hi)


def positive_float(name: str, hi: float = math.inf):
    """argparse type: a finite number above 0 and at most hi, or one sentence naming the bound."""
    return float_arg(name, 0.0, hi)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise PlanError with one sentence (exit 1), in place of argparse's usage
    dump and exit 2."""

    def error(self, message):
        message = re.sub(r"^argument (\S+): (?=\1 )", "", message)  # "argument --gpus: --gpus must be ..."
        raise PlanError(f"{message} (see `{self.prog} --help`)")


class _RecordExplicit(argparse.Action):
    """Stores the value and records that the flag was given, so that a flag the cluster file also sets can be
    compared with it (check_flags_beside_cluster) rather than silently overridden."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given = dict(getattr(namespace, "given_cluster_flags", None) or {})
        given[self.dest] = option_string
        namespace.given_cluster_flags = given


CLUSTER_FILE_FIELDS = {"gpu": "gpu", "gpus_per_node": "gpus_per_node", "inter_node_gbps": "inter_node_gb_per_s",
                       "headroom_gib": "memory_headroom_gib"}
"""The flags a cluster file replaces (argument dest: ClusterSpec field)."""


def check_flags_beside_cluster(args, cluster):
    """`cluster` (from --cluster) with the flags also given checked against it: a flag the file sets must agree
    with it (one sentence naming both otherwise: the file wins, and a flag that silently did nothing would
    mislead); a headroom the file leaves unset is taken from --headroom-gib."""
    from dataclasses import replace

    for dest, option in (getattr(args, "given_cluster_flags", None) or {}).items():
        field = CLUSTER_FILE_FIELDS[dest]
        mine, theirs = getattr(args, dest), getattr(cluster, field)
        if theirs is None:
            cluster = replace(cluster, **{field: mine})
        elif mine != theirs:
            def shown(v):
                return f"{v:g}" if isinstance(v, float) else str(v)
            raise PlanError(f"{option} {shown(mine)} differs from the {field} {shown(theirs)} of the cluster file "
                            f"'{args.cluster}', which sets the cluster; drop one")
    return cluster


def add_model_cluster_args(ap: argparse.ArgumentParser, gpus_required: bool = True) -> None:
    """The model, the cluster, the profile and the training shape: what `resolve_inputs` turns into planner inputs.

    Args:
        ap: the parser to add them to.
        gpus_required: add --gpus (a command that takes several GPU counts declares its own).
    """
    from planner.cluster import GPU_KINDS

    ap.add_argument("--model", required=True, help="catalogue name (e.g. gpt-70b, llama3-8b) or a Hugging Face config.json")
    if gpus_required:
        ap.add_argument("--gpus", type=positive_int("--gpus", MAX_GPUS), help=f"number of GPUs (at most {MAX_GPUS})")
    ap.add_argument("--gpu", default="h200-sxm", choices=sorted(GPU_KINDS), help="GPU kind (default h200-sxm)",
                    action=_RecordExplicit)
    ap.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node", MAX_GPUS_PER_NODE), default=8, help="default 8",
                    action=_RecordExplicit)
    ap.add_argument("--inter-node-gbps", type=positive_float("--inter-node-gbps", MAX_NETWORK_GB_PER_S), default=50.0,
                    help="network bandwidth per GPU in GB/s, one direction (default 50 = 400 Gb/s NDR)",
                    action=_RecordExplicit)
    ap.add_argument("--headroom-gib", type=float_arg("--headroom-gib", 0.0, 1e6, lo_open=False), default=None,
                    action=_RecordExplicit,
                    help="memory per GPU to leave free below the planner's allowance (default 5%% of the GPU's "
                         "memory; 0 plans to the allowance's edge)")
    ap.add_argument("--cluster", help="JSON file with the whole cluster description (the flags above, where given, "
                                      "must agree with it; --gpus overrides its num_gpus)")
    ap.add_argument("--profile", help="profile JSON (default: the one shipped for --gpu)")
    ap.add_argument("--allow-other-gpu-profile", action="store_true",
                    help="accept a profile measured on another GPU kind than the cluster's (refused otherwise)")
    ap.add_argument("--seq-len", type=positive_int("--seq-len", MAX_SEQ_LEN), help="tokens per sequence (default: the model's)")
    ap.add_argument("--global-batch", type=positive_int("--global-batch", MAX_GLOBAL_BATCH),
                    help="sequences per step (default: the model's, e.g. 1024 for GPT, 512 for Llama 3)")


def add_runtime_arg(ap: argparse.ArgumentParser) -> None:
    """--runtime: the training runtime the prediction is for (planner/cost/targets.py)."""
    from planner.plan import RUNTIME_TARGETS

    ap.add_argument("--runtime", choices=list(RUNTIME_TARGETS), default="ours",
                    help="predict for this runtime: ours (default; runtime/) or megatron (Megatron-Core with "
                         "Transformer Engine, eager, its TP/DP overlap; factors fitted on published runs)")


def resolve_inputs(args):
    """The planner's inputs from arguments of `add_model_cluster_args`, with every check in one place.

    Args:
        args: parsed arguments (a namespace with model, gpus, gpu, gpus_per_node, inter_node_gbps, headroom_gib,
            cluster, profile, seq_len, global_batch and optionally allow_other_gpu_profile).

    Returns:
        (model, cluster, training shape, profile).

    Raises:
        PlanError: one sentence for an unknown model, a bad cluster, a sequence beyond the model's or a bad profile.
    """
    from dataclasses import replace

    from planner.cluster import ClusterSpec, load_cluster_file, validate_cluster
    from planner.memory.model import GIB, memory_limit_bytes
    from planner.model import resolve_model
    from planner.plan import TrainingShape
    from planner.profile import load_profile

    model = resolve_model(args.model)
    if args.cluster:
        cluster = load_cluster_file(args.cluster)
        cluster = check_flags_beside_cluster(args, cluster)
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
    allowance_gib = memory_limit_bytes(cluster.kind.memory_gib) / GIB
    if cluster.headroom_gib >= allowance_gib:  # validate_cluster bounds it by the HBM, which is more
        given = f"memory_headroom_gib of '{args.cluster}'" if args.cluster else "--headroom-gib"
        raise PlanError(f"{given} {cluster.headroom_gib:g} leaves no memory to plan in: the planner allows "
                        f"{allowance_gib:.1f} GiB per {cluster.gpu} (its memory less what lies outside the allocator "
                        "and fragmentation)")
    seq = args.seq_len or model.default_seq_len
    gb = args.global_batch or model.default_global_batch
    if seq > model.max_seq_len:
        raise PlanError(f"--seq-len {seq} exceeds {model.name}'s maximum of {model.max_seq_len} tokens")
    shape = TrainingShape(seq_len=seq, global_batch=gb)
    profile = load_profile(args.profile, cluster.gpu, other_gpu_ok=getattr(args, "allow_other_gpu_profile", False))
    return model, cluster, shape, profile


def run_command(command, argv: list[str]) -> int:
    """Run `command(argv)` as `plan` runs its commands and return the exit code.

    A PlanError ends as "plan: <sentence>" on stderr with its exit code (1 bad input, 2 nothing fits); a missing
    PyTorch as one sentence naming the extra to install, exit 1; Ctrl-C as "plan: interrupted", exit 130.
    Warnings print as one "warning: ..." line.
    """
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        return int(command(argv) or 0)
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
