"""A plan file checked completely before it becomes a Plan: every key of its sections present and of its type,
every number finite and in range, the model name one an export may carry. A plan with `layout.micro_batch`
deleted is refused in one sentence naming the key, never run with the default. (Plan.from_dict calls this;
legality.check_plan then checks the layout against the model and the cluster.)"""
from __future__ import annotations

from dataclasses import MISSING, fields

from planner.errors import PlanError
from planner.limits import (MAX_EXPERTS, MAX_FFN, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS,
                            MAX_SEQ_LEN, MAX_VOCAB, is_number, is_whole)
from planner.shell_safe import check_model_name

SECTIONS = ("model", "cluster", "training", "layout", "stages", "prediction", "provenance")

INT_RANGES = {
    "training.seq_len": (1, MAX_SEQ_LEN), "training.global_batch": (1, MAX_GLOBAL_BATCH),
    "layout.micro_batch": (1, MAX_GLOBAL_BATCH),
    "stages.layers": (0, MAX_LAYERS), "stages.full_recompute_layers": (0, MAX_LAYERS),
    "stages.selective_recompute_layers": (0, MAX_LAYERS),
    "model.num_layers": (1, MAX_LAYERS), "model.hidden": (1, MAX_HIDDEN), "model.num_heads": (1, MAX_HEADS),
    "model.num_kv_heads": (1, MAX_HEADS), "model.ffn_hidden": (1, MAX_FFN), "model.vocab_size": (1, MAX_VOCAB),
    "model.max_seq_len": (1, MAX_SEQ_LEN), "model.default_seq_len": (1, MAX_SEQ_LEN),
    "model.default_global_batch": (1, MAX_GLOBAL_BATCH), "model.num_experts": (1, MAX_EXPERTS),
    "model.top_k": (1, MAX_EXPERTS), "model.shared_expert_ffn": (0, MAX_FFN), "model.head_dim_override": (0, MAX_HIDDEN),
    "model.rope_original_max_positions": (0, MAX_SEQ_LEN),
}
"""Whole-number fields and their ranges; a layout degree not listed here takes 1..MAX_GPUS."""

LATER_LAYOUT_KEYS = ("overlap_ep", "fp8", "grad_dtype", "cuda_graph", "schedule")
"""Layout keys a plan file may lack (hundreds of plans kept under benchmarks/ carry none of them): absent, they take
the dataclass default, which is what those plans run with (no EP chunking, bf16 GEMMs, fp32 gradients, eager
steps, the schedule their vpp implies: Layout.schedule). Every other layout key must be there."""


def check_section(d, cls, section: str, source: str, all_keys: bool = True, optional: tuple[str, ...] = ()) -> None:
    """`d` is an object holding `cls`'s fields (every one but `optional` when `all_keys`, else those without a
    default) with values of their declared type, and nothing else."""
    if not isinstance(d, dict):
        raise PlanError(f"{source}: {section} is not an object")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise PlanError(f"{source} has a malformed section: {section} has unknown fields {unknown}")
    for name, f in known.items():
        key = f"{section}.{name}"
        if name not in d:
            if (all_keys and name not in optional) or (f.default is MISSING and f.default_factory is MISSING):
                raise PlanError(f"{source} lacks the field '{key}'")
            continue
        check_value(d[name], str(f.type), key, source)


def check_value(v, type_name: str, key: str, source: str) -> None:
    """One field's value against its annotation (int, bool, str, float) and range."""
    generic = "stages." + key.rsplit(".", 1)[1] if key.startswith("stages[") else key
    if type_name == "bool":
        if not isinstance(v, bool):
            raise PlanError(f"{source}: {key} must be true or false, got {v!r}")
    elif type_name == "int":
        lo, hi = INT_RANGES.get(generic, (1, MAX_GPUS))
        if not is_whole(v) or not lo <= v <= hi:
            raise PlanError(f"{source}: {key} must be a whole number from {lo} to {hi}, got {v!r}")
    elif type_name == "float":
        if not is_number(v):
            raise PlanError(f"{source}: {key} must be a finite number, got {v!r}")
    elif type_name == "str":
        if not isinstance(v, str):
            raise PlanError(f"{source}: {key} must be a string, got {v!r}")


def check_plan_dict(d: dict, source: str, schema: dict) -> None:
    """Every section of a plan dictionary (after its format and version are known good). `schema` maps
    "training", "layout", "stages" and "prediction" to planner/plan.py's dataclasses, which it passes in (this module
    never imports planner.plan, which imports it)."""
    from planner.model import ModelSpec
    TrainingShape, Layout, StagePlan, Prediction = (schema[k] for k in ("training", "layout", "stages", "prediction"))

    for section in SECTIONS:
        if section not in d:
            raise PlanError(f"{source} lacks the field {section!r}")
    model = d["model"]
    check_section(model, ModelSpec, "model", source, all_keys=False)
    check_model_name(model["name"], source)
    if not isinstance(d["cluster"], dict):
        raise PlanError(f"{source}: cluster is not an object")
    from planner.cluster import ClusterSpec
    try:
        ClusterSpec.from_dict(d["cluster"])  # every number of it finite and in range (cluster.validate_cluster)
    except PlanError as exc:
        raise PlanError(f"{source}: {exc}") from None
    check_section(d["training"], TrainingShape, "training", source)
    check_section(d["layout"], Layout, "layout", source, optional=LATER_LAYOUT_KEYS)  # its values: legality.py
    check_schedule_name(d["layout"].get("schedule"), source)
    stages = d["stages"]
    if not isinstance(stages, list) or not 1 <= len(stages) <= MAX_LAYERS:
        raise PlanError(f"{source}: stages must be a list of 1 to {MAX_LAYERS} stages")
    for j, st in enumerate(stages):
        check_section(st, StagePlan, f"stages[{j}]", source)
    pred = d["prediction"]
    if pred is not None:
        check_section(pred, Prediction, "prediction", source)
        mem = pred["memory_gib_per_rank"]
        if not isinstance(mem, list) or not mem or not all(is_number(m) for m in mem):
            raise PlanError(f"{source}: prediction.memory_gib_per_rank must be a list of finite numbers")
        bd = pred["breakdown_s"]
        if not isinstance(bd, dict) or not all(isinstance(k, str) and is_number(v) for k, v in bd.items()):
            raise PlanError(f"{source}: prediction.breakdown_s must map names to finite numbers")
    if not isinstance(d["provenance"], dict):
        raise PlanError(f"{source}: provenance is not an object")


def check_schedule_name(name, source: str) -> None:
    """A layout's schedule name (absent or empty: derived from vpp) is a registered schedule (planner/schedules/)."""
    from planner.schedules import SCHEDULES

    if name and name not in SCHEDULES:
        raise PlanError(f"{source}: layout.schedule {name!r} is not a known pipeline schedule "
                        f"(known: {', '.join(SCHEDULES)})")
