"""Legality of a layout: the one place where the divisibility and placement rules live.

`layout_violation` returns the first rule a layout breaks, as a sentence, or None; the search uses it to
filter candidates, `check_plan` to refuse plan files, and the runtime to refuse to launch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from planner.errors import PlanError
from planner.model import ModelSpec
from planner.schedules import SCHEDULES, num_micro_batches, schedule_named

if TYPE_CHECKING:  # planner.plan imports this module to check the plans it loads
    from planner.plan import Layout, Plan, StagePlan, TrainingShape

SHARDING_LEVELS = ("none", "optimizer", "optimizer+grads", "full")
"""Data-parallel sharding: none (plain DDP); optimizer = fp32 master weights and Adam states sharded (the
distributed optimizer, ZeRO-1); optimizer+grads (ZeRO-2); full = parameters too (FSDP / ZeRO-3)."""

GRAD_DTYPES = ("fp32", "bf16")
"""Precision of the main gradients (the buffer weight-gradient GEMMs accumulate into, over micro-batches) and of
their data-parallel reduction: fp32 (Megatron-Core's --accumulate-allreduce-grads-in-fp32), or bf16 (its default
without that flag: half the gradient memory and half the reduce-scatter bytes, bf16 rounding at every add).
Master weights and Adam states stay fp32 either way."""

RECOMPUTE_MODES = ("none", "selective", "full")
"""Per layer: none keeps every activation; selective recomputes norms, the attention core and the MLP
activation (cheap elementwise work, keeps the GEMM inputs it cannot cheaply rebuild); full keeps only the
layer's input and reruns the whole layer forward in backward."""


def layout_violation(model: ModelSpec, shape: TrainingShape, lay: Layout, num_gpus: int | None = None,
                     gpus_per_node: int | None = None, gpu: str | None = None) -> str | None:
    for name in ("tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch"):
        v = getattr(lay, name)
        if not isinstance(v, int) or v < 1:
            return f"{name} must be a positive integer, got {v!r}"
    if lay.sharding not in SHARDING_LEVELS:
        return f"sharding '{lay.sharding}' is not one of {', '.join(SHARDING_LEVELS)}"
    if lay.grad_dtype not in GRAD_DTYPES:
        return f"gradient precision '{lay.grad_dtype}' is not one of {', '.join(GRAD_DTYPES)}"
    if num_gpus is not None and lay.world_size != num_gpus:
        return (f"tp*pp*dp*cp = {lay.tp}*{lay.pp}*{lay.dp}*{lay.cp} = {lay.world_size} "
                f"does not equal the {num_gpus} GPUs")
    if model.num_heads % lay.tp:
        return f"{model.num_heads} attention heads are not divisible by TP {lay.tp}"
    if model.num_kv_heads % lay.tp and lay.tp % model.num_kv_heads:
        # fewer KV heads than TP ranks: each is replicated over the ranks whose q heads use it
        return f"{model.num_kv_heads} KV heads are neither a multiple nor a divisor of TP {lay.tp}"
    if model.ffn_hidden % lay.tp:
        return f"MLP width {model.ffn_hidden} is not divisible by TP {lay.tp}"
    if model.padded_vocab % lay.tp:
        return f"padded vocabulary {model.padded_vocab} is not divisible by TP {lay.tp}"
    if gpus_per_node is not None and lay.tp > gpus_per_node:
        return f"TP {lay.tp} would span nodes ({gpus_per_node} GPUs per node)"
    if lay.vpp > 1 and lay.pp == 1:
        return "virtual stages need pipeline parallelism (pp > 1)"
    if model.num_layers < lay.pp * lay.vpp:
        return f"{model.num_layers} layers cannot fill {lay.pp * lay.vpp} pipeline stages"
    if shape.seq_len % (2 * lay.cp * (lay.tp if lay.tp > 1 else 1)) and lay.cp > 1:
        return f"sequence {shape.seq_len} is not divisible by 2*CP*TP = {2 * lay.cp * lay.tp}"
    if lay.tp > 1 and shape.seq_len % lay.tp:
        return f"sequence {shape.seq_len} is not divisible by TP {lay.tp} (sequence parallelism)"
    if shape.seq_len > model.max_seq_len:
        return f"sequence {shape.seq_len} exceeds the model's maximum {model.max_seq_len}"
    if lay.ep > 1 and not model.is_moe:
        return "expert parallelism needs an MoE model"
    if model.num_experts % lay.ep:
        return f"{model.num_experts} experts are not divisible by EP {lay.ep}"
    if (lay.dp * lay.cp) % lay.ep:
        return f"EP {lay.ep} does not divide DP*CP = {lay.dp * lay.cp} (expert groups come from data x context ranks)"
    if shape.global_batch % (lay.micro_batch * lay.dp):
        return (f"global batch {shape.global_batch} is not divisible by micro-batch x DP = "
                f"{lay.micro_batch}*{lay.dp}")
    why = schedule_violation(shape, lay)
    if why:
        return why
    if lay.sharding == "full" and lay.ep > 1:
        # runtime/parallel/data_parallel.py's FSDP path shards expert weights over all data x context ranks instead
        # of the expert-data-parallel group; refuse the layout rather than plan what the runtime gets wrong
        return "fully sharded data parallelism with expert parallelism is not supported by the runtime yet"
    if lay.sharding != "none" and lay.dp * lay.cp == 1:
        return f"sharding '{lay.sharding}' needs more than one data-parallel rank"
    if lay.fp8 and gpu is not None and gpu not in FP8_GPUS:
        return f"FP8 GEMMs need FP8 tensor cores (Hopper), which the {gpu} does not have"
    if lay.cuda_graph:
        why = cuda_graph_violation(model, lay, gpu)
        if why:
            return f"a CUDA-graph step is not possible here: {why}"
    return None


def schedule_violation(shape: TrainingShape, lay: Layout) -> str | None:
    """Why the layout's pipeline schedule (Layout.schedule) cannot run its degrees and micro-batches, or None."""
    schedule = SCHEDULES.get(lay.schedule)
    if schedule is None:
        return f"the pipeline schedule {lay.schedule!r} is not known (known: {', '.join(SCHEDULES)})"
    return schedule.violation(lay.pp, lay.vpp, num_micro_batches(shape, lay))


GROUPED_GEMM_GPUS = ("h200-sxm", "h100-sxm", "h100-96gb", "h800")
"""GPU kinds where the MoE experts run as grouped GEMMs with their row counts on the device (Hopper:
runtime/parallel/expert.py, grouped_mm_supported); elsewhere the expert loop reads the counts on the host."""


FP8_GPUS = ("h200-sxm", "h100-sxm", "h100-96gb", "h800", "cpu")
"""GPU kinds whose FP8 GEMMs (torch._scaled_mm, runtime/parallel/fp8.py) run: Hopper's FP8 tensor cores, and the CPU
runs that test them. The A100 (Ampere) has none."""


def cuda_graph_violation(model: ModelSpec, lay: Layout, gpu: str | None = None) -> str | None:
    """Why runtime/graph.py cannot capture this layout's step on `gpu` (None: not known), or None. A captured
    step replays without the host, so nothing in it may read a GPU value on the host or depend on host-side
    scheduling."""
    if gpu == "cpu":
        return "CUDA graphs need a GPU (CPU runs issue the step eagerly)"
    if model.is_moe and lay.ep > 1:
        return "MoE routing reads the all-to-all split sizes on the host (EP > 1)"
    if model.is_moe and gpu is not None and gpu not in GROUPED_GEMM_GPUS:
        return f"without grouped GEMMs ({gpu}) the MoE expert loop reads its row counts on the host"
    if lay.sharding == "full":
        return "the fully sharded optimizer steps torch.optim.AdamW with a host-side learning rate"
    return None


def stages_violation(model: ModelSpec, lay: Layout, stages: list[StagePlan]) -> str | None:
    if len(stages) != lay.pp * lay.vpp:
        return f"{len(stages)} stages given for PP {lay.pp} x VPP {lay.vpp}"
    if sum(s.layers for s in stages) != model.num_layers:
        return f"stages hold {sum(s.layers for s in stages)} layers, the model has {model.num_layers}"
    for j, s in enumerate(stages):
        if s.layers < 1:
            return f"stage {j} holds no layer"
        if s.full_recompute_layers < 0 or s.selective_recompute_layers < 0 or \
                s.full_recompute_layers + s.selective_recompute_layers > s.layers:
            return f"stage {j} recomputes more layers than it holds"
    return None


def check_layout(model: ModelSpec, shape: TrainingShape, lay: Layout, num_gpus: int | None = None,
                 gpus_per_node: int | None = None, gpu: str | None = None) -> None:
    why = layout_violation(model, shape, lay, num_gpus, gpus_per_node, gpu)
    if why:
        raise PlanError(f"illegal layout {lay.short()}: {why}")


def check_plan(plan: Plan) -> None:
    check_layout(plan.model, plan.training, plan.layout, plan.cluster.get("num_gpus"),
                 plan.cluster.get("gpus_per_node"), plan.cluster.get("gpu"))
    why = stages_violation(plan.model, plan.layout, plan.stages)
    if why:
        raise PlanError(f"illegal plan: {why}")
    if plan.runtime == "ours":
        why = ours_violation(plan.layout)
        if why:
            raise PlanError(f"illegal plan: {why}")


def ours_violation(lay: Layout) -> str | None:
    """Why our runtime (runtime/) cannot run this layout although the planner may price it for another runtime
    target (a plan's `runtime`), or None: `check_plan` asks it of plans for our runtime, and `plan validate
    --simulate`, which builds our runtime's program whatever the plan's target, of every plan."""
    schedule = schedule_named(lay.schedule)
    return None if schedule.runs_on_ours else schedule.refusal


def check_recompute_name(mode: str) -> None:
    if mode not in RECOMPUTE_MODES:
        raise PlanError(f"recompute '{mode}' is not one of {', '.join(RECOMPUTE_MODES)}")
