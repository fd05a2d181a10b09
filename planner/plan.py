"""The plan: one versioned JSON schema shared by the planner (which writes it) and the runtime (which runs it).

A plan holds the model spec, the cluster, the training shape, the layout (parallel degrees, micro-batch,
sharding level, overlap switches), the per-stage split of layers with recompute, the prediction and its
provenance. The runtime loads plans through this module, so it stays free of heavy imports.

Rank order (the runtime builds its process groups in this order, the planner prices groups by it):
tensor-parallel ranks are adjacent, then context, then data, then pipeline (Megatron-Core's "tp-cp-dp-pp");
expert-parallel groups are drawn from the data x context ranks, as Megatron-Core does.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from planner.errors import PlanError, read_json
from planner.legality import check_plan
from planner.model import ModelSpec
from planner.plan_check import check_plan_dict
from planner.schedules import default_schedule_name, num_micro_batches  # noqa: F401 (planner.plan's name)

PLAN_FORMAT = "parallel-plan/plan"
PLAN_VERSION = 2
RUNTIME_TARGETS = ("ours", "megatron")
"""The runtimes a plan's prediction can be for (planner/cost/targets.py prices them)."""
READABLE_PLAN_VERSIONS = (1, 2)
"""Version 2 added `runtime` (the prediction target); a version-1 plan reads as runtime 'ours'."""

@dataclass(frozen=True)
class TrainingShape:
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step, summed over all data-parallel replicas."""


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    """Tensor-parallel degree; with tp > 1 sequence parallelism is always on (norms and dropout-free
    residual stream sharded over the sequence), as Megatron-Core recommends."""
    pp: int = 1
    """Pipeline stages (ranks)."""
    vpp: int = 1
    """Virtual stages per pipeline rank (interleaved 1F1B when > 1)."""
    dp: int = 1
    """Data-parallel replicas."""
    cp: int = 1
    """Context-parallel degree (ring attention; sequence split into 2*cp chunks for causal balance)."""
    ep: int = 1
    """Expert-parallel degree (MoE); expert groups come from the dp x cp ranks, so ep divides dp*cp."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    sharding: str = "optimizer"
    """One of planner.legality.SHARDING_LEVELS."""
    overlap_tp: bool = True
    """Overlap tensor-parallel all-gather / reduce-scatter with the GEMMs next to them."""
    overlap_dp: bool = True
    """Overlap gradient reduce-scatter with backward and parameter all-gather with forward."""
    overlap_pp: bool = True
    """Post pipeline sends/receives asynchronously so they run beside compute."""
    overlap_ep: bool = False
    """MoE under EP > 1: dispatch each rank's tokens in two chunks, so that the all-to-alls of one run beside
    the experts of the other, forward and backward (runtime/parallel/expert.py). Smaller expert GEMMs; the
    cost model prices both (planner/cost/layer.py) and the search picks."""
    fp8: bool = False
    """Forward and input-gradient GEMMs of the transformer layers in FP8 (E4M3 / E5M2 with per-tensor current
    scaling, runtime/parallel/fp8.py); weight gradients, embedding, output layer and attention stay bf16."""
    grad_dtype: str = "fp32"
    """One of planner.legality.GRAD_DTYPES: the main gradients' precision and that of their data-parallel reduction. A numerics
    choice, so the user's (plan --grad-dtype), never the search's."""
    cuda_graph: bool = False
    """Capture the whole step (forward, backward, gradient reduction, AdamW) once as a CUDA graph and replay it
    every step (runtime/graph.py): the host issues one launch per step instead of ~50 kernels per layer, so
    a step the host would pace runs at the GPU's pace, and the cost model prices no host time for it. Legal
    only where the step never waits for the GPU on the host (planner/legality.py, cuda_graph_violation); the
    search turns it on wherever it is legal on a GPU. CPU runs ignore it."""
    schedule: str = ""
    """The pipeline schedule's name (planner/schedules/, SCHEDULES): '1f1b', 'interleaved', 'dualpipe' (modelled for
    the megatron target only) or a registered one. Left empty (and in plan files that carry no such key) it is
    'interleaved' when vpp > 1, else '1f1b'."""

    def __post_init__(self):
        if not self.schedule:
            object.__setattr__(self, "schedule", default_schedule_name(self.vpp))

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1

    @property
    def num_virtual_stages(self) -> int:
        return self.pp * self.vpp

    def short(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}" + (f"x{self.vpp}v" if self.vpp > 1 else ""), f"DP{self.dp}"]
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.fp8:
            parts.append("FP8")
        if self.grad_dtype != "fp32":
            parts.append(f"{self.grad_dtype}-grads")
        if self.cuda_graph:
            parts.append("graph")
        return " ".join(parts)


@dataclass(frozen=True)
class StagePlan:
    """One virtual pipeline stage: a contiguous run of layers on pipeline rank `index % pp`."""

    layers: int
    """Transformer layers in this stage."""
    full_recompute_layers: int = 0
    """Of those, how many keep only their input and rerun their forward in backward."""
    selective_recompute_layers: int = 0
    """Of the remaining layers, how many use selective recompute."""

    def recompute_label(self) -> str:
        parts = []
        if self.full_recompute_layers:
            parts.append(f"full {self.full_recompute_layers}")
        if self.selective_recompute_layers:
            parts.append(f"sel {self.selective_recompute_layers}")
        return ", ".join(parts) or "none"

    def layer_modes(self) -> list[str]:
        """Recompute mode of each layer of the stage, in order (full ones first, as Megatron's 'block')."""
        n_none = self.layers - self.full_recompute_layers - self.selective_recompute_layers
        return ["full"] * self.full_recompute_layers + ["selective"] * self.selective_recompute_layers + ["none"] * n_none


@dataclass
class Prediction:
    """What the cost model predicts for a plan; times in seconds, memory in GiB (2**30 bytes)."""

    step_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    """Model FLOPs (Megatron / PaLM convention) per second per GPU over the GPU's dense bf16 datasheet peak."""
    memory_gib_per_rank: list[float]
    """Predicted peak allocated memory of each pipeline rank."""
    memory_limit_gib: float
    """What the planner allows per GPU: capacity less the stated reserve and fragmentation margin."""
    breakdown_s: dict[str, float] = field(default_factory=dict)
    """Step time split into compute, recompute, exposed communication per dimension, bubble, optimizer."""


@dataclass
class Plan:
    model: ModelSpec
    cluster: dict
    """ClusterSpec.to_dict() of the cluster planned for."""
    training: TrainingShape
    layout: Layout
    stages: list[StagePlan]
    """pp * vpp virtual stages in model order; stage j lives on pipeline rank j % pp."""
    prediction: Prediction | None = None
    provenance: dict = field(default_factory=dict)
    runtime: str = "ours"
    """The runtime the prediction is for (planner/cost/targets.py, RUNTIME_TARGETS): 'ours' (runtime/) or
    'megatron' (Megatron-Core with Transformer Engine)."""

    @property
    def num_micro_batches(self) -> int:
        return num_micro_batches(self.training, self.layout)

    def stages_of_rank(self, rank: int) -> list[int]:
        return [j for j in range(len(self.stages)) if j % self.layout.pp == rank]

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "runtime": self.runtime,
            "model": self.model.to_dict(),
            "cluster": self.cluster,
            "training": asdict(self.training),
            "layout": asdict(self.layout),
            "stages": [asdict(s) for s in self.stages],
            "prediction": asdict(self.prediction) if self.prediction else None,
            "provenance": self.provenance,
        }

    @staticmethod
    def from_dict(d: dict, source: str = "this plan") -> "Plan":
        """The plan of a to_dict() dictionary; `source` names it in the sentence of a PlanError."""
        if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
            raise PlanError(f"{source} is not a parallel-plan plan (its 'format' field is missing or foreign)")
        if d.get("version") not in READABLE_PLAN_VERSIONS:
            raise PlanError(f"{source} has plan version {d.get('version')!r}, which is not supported (this build reads "
                            f"versions {', '.join(map(str, READABLE_PLAN_VERSIONS))})")
        runtime = d.get("runtime", "ours") if d.get("version") >= 2 else "ours"
        if runtime not in RUNTIME_TARGETS:
            raise PlanError(f"{source} names the runtime {runtime!r}; known: {', '.join(RUNTIME_TARGETS)}")
        check_plan_dict(d, source, {"training": TrainingShape, "layout": Layout, "stages": StagePlan,
                                    "prediction": Prediction})
        try:
            plan = Plan(
                model=ModelSpec.from_dict(d["model"]),
                cluster=dict(d["cluster"]),
                training=TrainingShape(**d["training"]),
                layout=Layout(**d["layout"]),
                stages=[StagePlan(**s) for s in d["stages"]],
                prediction=Prediction(**d["prediction"]) if d.get("prediction") else None,
                provenance=dict(d.get("provenance") or {}),
                runtime=runtime,
            )
        except KeyError as exc:
            raise PlanError(f"{source} lacks the field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise PlanError(f"{source} has a malformed section ({exc})") from None
        check_plan(plan)
        return plan

    def save(self, path: Path, overwrite: bool = False) -> None:
        path = Path(path)
        if path.exists() and not overwrite:
            raise PlanError(f"'{path}' already exists; pass --force to overwrite it")
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @staticmethod
    def load(path: Path) -> "Plan":
        d = read_json(path, "plan file")
        return Plan.from_dict(d, f"plan file '{path}'")


def stage_layer_ranges(stages) -> list[tuple[int, int]]:
    """[start, end) layers of each virtual stage (StagePlans in model order): where the runtime cuts the model."""
    out, start = [], 0
    for s in stages:
        out.append((start, start + s.layers))
        start += s.layers
    return out


def even_stages(num_layers: int, num_stages: int, recompute: str = "none") -> list[StagePlan]:
    """Split layers as evenly as possible (earlier stages take the remainder) with one recompute mode."""
    base, extra = divmod(num_layers, num_stages)
    out = []
    for j in range(num_stages):
        n = base + (1 if j < extra else 0)
        out.append(StagePlan(layers=n, full_recompute_layers=n if recompute == "full" else 0,
                             selective_recompute_layers=n if recompute == "selective" else 0))
    return out
