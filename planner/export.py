"""`plan export plan.json --to megatron|torchrun|slurm`: a plan in the form another launcher takes.

- megatron: the Megatron-LM `pretrain_gpt.py` arguments that realise the plan (parallel sizes, the layer
  split, micro/global batch, sequence parallel, distributed optimizer, overlap flags, recompute, model
  shape), as a bash array with a comment block naming what Megatron cannot express.
- torchrun: the exact command `plan launch` runs (built by planner.launch_command, which `plan launch` uses too).
- slurm: an sbatch script running the plan on N nodes: srun starts one `plan launch` per node, torchrun
  underneath, rendezvous on the first node.

Megatron-LM argument names were checked against the NVIDIA/Megatron-LM source that megatron_source() names:
megatron/training/arguments.py (hand-written arguments, e.g. --num-layers-per-virtual-pipeline-stage,
--decoder-first-pipeline-num-layers, --pipeline-model-parallel-layout, --use-distributed-optimizer,
--overlap-grad-reduce, --swiglu, --group-query-attention) and the dataclasses it turns into arguments
through ArgumentGroupFactory (field `foo_bar` -> `--foo-bar`): megatron/core/model_parallel_config.py
(--tensor-model-parallel-size, --sequence-parallel, --context-parallel-size, --expert-model-parallel-size,
--tp-comm-overlap, --bf16), megatron/core/transformer/transformer_config.py (--num-layers, --hidden-size,
--num-query-groups, --normalization, --disable-bias-linear, --add-qkv-bias, --recompute-granularity/-method/-num-layers,
--recompute-modules, --moe-router-topk, --norm-epsilon: field layernorm_epsilon's own argparse name, --qk-layernorm:
field qk_layernorm, a store_true flag; megatron/core/transformer/attention.py applies `normalization` with
layernorm_epsilon over each head of q and k (hidden_size_per_attention_head) before rotary, as Qwen3; its
examples/post_training/modelopt/conf/Qwen/Qwen3-*.sh pass it),
megatron/training/config/training_config.py (--micro-batch-size, --global-batch-size),
megatron/core/transformer/pipeline_parallel_layer_layout.py (layout syntax). The rotary arguments (--rotary-base,
an int there; --use-rope-scaling, --rope-scaling-factor) are hand-written in arguments.py; what the llama3 scaling
applies is in megatron/core/models/common/embeddings/rotary_pos_embedding.py and gpt_builders.py (MEGATRON_ROPE_SCALING).
--virtual-pipeline-model-parallel-size is not a command-line argument there (excluded from the
factory); --num-layers-per-virtual-pipeline-stage or the layout string set it.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from planner.errors import PlanError
from planner.lr_schedule import OptimizerSettings
from planner.lr_schedule import add_options as add_optimizer_options
from planner.lr_schedule import from_args as optimizer_settings
from planner.lr_schedule import to_argv as optimizer_argv
from planner.export_prediction import runtime_predictions
from planner.plan import Plan
from planner.shell_safe import check_slurm_time, check_slurm_value, safe_model_name
from planner.export_megatron import (MEGATRON_SOURCE_FILE, MegatronExport, megatron_args,  # noqa: F401 (re-exported)
                                      megatron_source)

def build_parser() -> argparse.ArgumentParser:
    """`plan export`'s arguments."""
    from planner.arguments import Parser, add_runtime_arg, positive_int
    from planner.launch_command import add_launch_flags
    from planner.limits import MAX_GPUS, MAX_GPUS_PER_NODE

    ap = Parser(prog="plan export", description="Write a plan as Megatron-LM arguments, the torchrun command of "
                "`plan launch`, or a Slurm batch script.")
    ap.add_argument("plan", help="plan.json written by `plan -o`")
    ap.add_argument("--to", required=True, choices=["megatron", "torchrun", "slurm"])
    add_runtime_arg(ap)
    ap.add_argument("--profile", help="profile JSON for the predictions (default: the one shipped for the plan's GPU)")
    ap.add_argument("-o", "--output", help="write here instead of standard output")
    ap.add_argument("--force", action="store_true", help="overwrite the -o file if it exists")
    ap.add_argument("--nodes", type=positive_int("--nodes", MAX_GPUS),
                    help="nodes to run on (default: world size / the plan's GPUs per node)")
    ap.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node", MAX_GPUS_PER_NODE),
                    help="default: the plan's cluster (8 when it does not say)")
    # `plan launch`'s own flags, forwarded to it (torchrun, slurm)
    add_launch_flags(ap, ("--node-rank", "--rdzv-endpoint", "--steps", "--data", "--results"), help={
        "--node-rank": "torchrun: this node's rank (several nodes)",
        "--rdzv-endpoint": "torchrun: host:port of the rendezvous (several nodes)",
        "--steps": "training steps (torchrun, slurm)",
        "--data": "data source passed to `plan launch` (torchrun, slurm)",
        "--results": "per-step results CSV (torchrun, slurm; default: beside the plan)"})
    ap.add_argument("--time", default="01:00:00", help="slurm: wall-clock limit (default 01:00:00)")
    ap.add_argument("--partition", help="slurm: partition")
    ap.add_argument("--account", help="slurm: account")
    ap.add_argument("--job-name", help="slurm: job name (default plan-<model>)")
    add_optimizer_options(ap)  # `plan launch`'s (torchrun, slurm) and their Megatron-LM equivalents (megatron)
    return ap


def render_megatron(plan: Plan, plan_path: str, optimizer: OptimizerSettings | None = None,
                    predictions: list[str] | None = None) -> str:
    """The bash script of a plan's Megatron-LM arguments: a comment block (what it realises, the predictions, what
    Megatron cannot express) and the MEGATRON_ARGS array, one flag per line."""
    ex = megatron_args(plan, optimizer)
    lay = plan.layout
    lines = [
        "#!/bin/bash",
        f"# Megatron-LM {ex.script} arguments realising {plan_path}: {plan.model.name}, {lay.short()}"
        + (f" x{lay.vpp} virtual stages" if lay.vpp > 1 else "") + f", world size {lay.world_size}",
        f"# (data parallel size {lay.dp} follows from the world size; launch {lay.world_size} processes)",
        f"# argument names checked against {megatron_source()}",
    ]
    for text in predictions or []:
        lines.append("# " + text)
    lines.append("#")
    lines.append("# Not expressible in Megatron-LM, or only approximately:")
    for n in ex.notes:
        lines.append("#   - " + n)
    lines.append("MEGATRON_ARGS=(")
    for g in ex.groups():
        lines.append("    " + " ".join(shlex.quote(x) for x in g))
    lines.append(")")
    lines.append(f"# torchrun --nproc-per-node <gpus per node> --nnodes <nodes> ... {ex.script} \"${{MEGATRON_ARGS[@]}}\" "
                 "<data, tokenizer and --train-iters arguments>")
    return _script(lines)


def _script(lines: list[str]) -> str:
    """The script's text: every comment line (not the #! and #SBATCH ones) cleared of line breaks and control
    characters, so that no text from a plan or a path can start a line of its own."""
    def safe(line: str) -> str:
        if line.startswith("#") and not line.startswith(("#!", "#SBATCH")):
            return "".join(c if c.isprintable() else " " for c in line)
        return line
    return "\n".join(safe(ln) for ln in lines) + "\n"


# -- torchrun / slurm -------------------------------------------------------------------------------------

def _gpus_per_node(plan: Plan, args) -> int:
    """--gpus-per-node, else the plan's cluster's, else 8."""
    return args.gpus_per_node or int(plan.cluster.get("gpus_per_node") or 8)


def _nodes(plan: Plan, args) -> int:
    """The nodes the plan runs on: --nodes (which must divide the world size and keep each TP group on one node),
    else the world size over the GPUs per node; a PlanError where the processes do not split evenly."""
    world = plan.layout.world_size
    if args.nodes:
        if world % args.nodes:
            raise PlanError(f"the plan's {world} processes ({plan.layout.short()}) do not split evenly over "
                            f"{args.nodes} nodes")
        per_node, tp = world // args.nodes, plan.layout.tp
        if per_node % tp:  # ranks are placed TP fastest: a TP group would span nodes, over the network
            raise PlanError(f"{args.nodes} nodes of {per_node} GPUs would split each TP group of {tp} across "
                            f"nodes, which the plan did not price; plan again with --gpus-per-node {per_node}, or "
                            f"give fewer nodes")
        return args.nodes
    g = min(_gpus_per_node(plan, args), world)
    if world % g:
        raise PlanError(f"the plan's {world} processes do not fill whole nodes of {g} GPUs; pass --nodes")
    return world // g


def _device(plan: Plan) -> str:
    """Where the plan's processes run: the CPU for a plan made for --gpu cpu, else CUDA."""
    return "cpu" if plan.cluster.get("gpu") == "cpu" else "cuda"


def launch_argv(plan_path: str, args, nodes: int, nproc: int, node_rank="0", rdzv=None,
                device: str = "cuda") -> list[str]:
    """The `plan launch` arguments this export stands for (`device`: cpu for a plan made for --gpu cpu)."""
    out = [plan_path, "--steps", str(args.steps), "--data", args.data, "--nproc-per-node", str(nproc),
           "--nnodes", str(nodes), "--device", device]
    if args.results:
        out += ["--results", args.results]
    out += optimizer_argv(optimizer_settings(args))
    if nodes > 1:
        out += ["--node-rank", str(node_rank), "--rdzv-endpoint", rdzv]
    return out


def torchrun_command(plan: Plan, plan_path: str, args) -> list[str]:
    """The command `plan launch` runs, from the builder `plan launch` itself uses (planner.launch_command)."""
    from planner import launch_command as launch

    nodes = _nodes(plan, args)
    nproc = plan.layout.world_size // nodes
    if nodes > 1 and not args.rdzv_endpoint:
        raise PlanError(f"the plan runs on {nodes} nodes; give --rdzv-endpoint host:port of the first node "
                        "(or export --to slurm, which finds it)")
    largs = launch.build_parser().parse_args(launch_argv(plan_path, args, nodes, nproc, args.node_rank,
                                                         args.rdzv_endpoint, _device(plan)))
    results = Path(largs.results) if largs.results else Path(plan_path).with_suffix(".results.csv")
    return launch.torchrun_command(largs, nproc, results)


def render_torchrun(plan: Plan, plan_path: str, args) -> str:
    """The torchrun command of `plan launch` for this node, under a comment saying what it runs and where."""
    cmd = torchrun_command(plan, plan_path, args)
    nodes = _nodes(plan, args)
    head = f"# `plan launch` runs this for {plan_path} ({plan.layout.short()}, world size {plan.layout.world_size}, " \
           f"{nodes} node(s) x {plan.layout.world_size // nodes})"
    if nodes > 1:
        head += f"; run it on every node with its own --node-rank (this one: {args.node_rank})"
    return _script([head, " ".join(shlex.quote(c) for c in cmd)])


def render_slurm(plan: Plan, plan_path: str, args) -> str:
    """An sbatch script that runs the plan on its nodes: one `plan launch` task per node, each with its own
    --node-rank, the rendezvous on the first node. The Slurm values are checked to be safe in the script."""
    nodes = _nodes(plan, args)
    world = plan.layout.world_size
    nproc = world // nodes
    name = check_slurm_value("--job-name", args.job_name or f"plan-{safe_model_name(plan.model.name)}")
    check_slurm_time(args.time)
    if args.partition:
        check_slurm_value("--partition", args.partition, list_ok=True)
    if args.account:
        check_slurm_value("--account", args.account)
    plan_abs = str(Path(plan_path).resolve())
    # every node gets the same arguments but its own --node-rank, which srun's task expands for itself
    largv = launch_argv(plan_abs, args, nodes, nproc, "NODE_RANK", "RDZV", _device(plan))
    if nodes > 1:
        i = largv.index("--node-rank")
        del largv[i:i + 2]
        largv[largv.index("RDZV")] = "RDZV"
    quoted = ["${MASTER_ADDR}:${MASTER_PORT}" if x == "RDZV" else shlex.quote(x) for x in largv]
    quoted = ['"${MASTER_ADDR}:${MASTER_PORT}"' if x.startswith("${MASTER") else x for x in quoted]
    lines = [
        "#!/bin/bash",
        f"# Slurm batch script for {plan_path}: {plan.model.name}, {plan.layout.short()}, world size {world} "
        f"= {nodes} node(s) x {nproc} GPUs.",
        "# One task per node runs `plan launch` (torchrun underneath); the first node hosts the rendezvous.",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={args.time}",
        "#SBATCH --output=%x-%j.out",
    ]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    lines += [
        "set -euo pipefail",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=${MASTER_PORT:-29500}",
        f'if [ "$SLURM_JOB_NUM_NODES" -ne {nodes} ]; then',
        f'    echo "this plan needs {nodes} node(s), the job has $SLURM_JOB_NUM_NODES" >&2; exit 1',
        "fi",
        "LAUNCH_ARGS=(" + " ".join(quoted) + ")",
        "# one task per node; each appends its own node rank ($SLURM_NODEID, expanded by the task, not here)",
        f"srun --kill-on-bad-exit=1 --ntasks={nodes} --ntasks-per-node=1 \\",
        "    bash -c 'exec plan launch \"$@\"" + (" --node-rank \"$SLURM_NODEID\"" if nodes > 1 else "")
        + "' plan-launch \"${LAUNCH_ARGS[@]}\"",
    ]
    return _script(lines)


def _refuse_approximated(plan: Plan) -> None:
    """One sentence for a plan of a model type planned as a GPT-style approximation (planner/hf_checks.py
    APPROXIMATED_TYPES): `plan launch` refuses to train it, so its torchrun and Slurm commands would stop at launch,
    and Megatron-LM's arguments would describe another model (learned positions, a sequential residual)."""
    from planner.hf_checks import APPROXIMATED_TYPES

    model_type = plan.model.hf_model_type.lower()
    if model_type in APPROXIMATED_TYPES:
        raise PlanError(f"model_type '{model_type}' is planned with an approximated architecture (GPT-style, which "
                        "its positions, residual wiring or norms are not), so it is not exported: `plan launch` "
                        "refuses to train it and Megatron-LM's arguments would describe another model")


def main(argv: list[str] | None = None) -> int:
    """`plan export`: write the plan in the asked form to -o or standard output, its predictions on standard
    error. Returns the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    plan = Plan.load(Path(args.plan))
    _refuse_approximated(plan)
    if args.output:
        from planner.outputs import check_output_file
        check_output_file(Path(args.output), "-o", overwrite=args.force)
    # Megatron's arguments come with the Megatron-target prediction (and the --runtime one beside it when it differs)
    runtimes = (["megatron"] + ([args.runtime] if args.runtime != "megatron" else [])) if args.to == "megatron" \
        else [args.runtime]
    predictions = runtime_predictions(plan, runtimes, args.profile)
    if args.to == "megatron":
        text = render_megatron(plan, args.plan, optimizer_settings(args), predictions)
    elif args.to == "torchrun":
        text = render_torchrun(plan, args.plan, args)
    else:
        text = render_slurm(plan, args.plan, args)
    for line in predictions:  # beside the file or the command, once it could be written
        print(line, file=sys.stderr)
    if args.output:
        from planner.outputs import write_file
        write_file(Path(args.output), text, mode=0o755)  # a new script is executable; an existing file keeps its mode
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    from planner.arguments import run_command
    sys.exit(run_command(main, sys.argv[1:]))
