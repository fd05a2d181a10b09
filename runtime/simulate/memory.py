"""The planner's prediction of one pipeline rank's memory, in the parts the simulation traces.

planner/memory/ranks.py predicts a rank's peak as states + in-flight activations + the largest transient
(+ cuBLAS workspaces, which live inside the allocator on a GPU but are no tensor of the step). Here that same
figure is split into weights, gradients, optimizer state (planner/memory/model.py's bytes per parameter at the plan's
sharding level), activations (the micro-batches in flight at the schedule's peak) and temporaries (the largest
transient, FSDP's gathered weights); `tensor_bytes` is their sum, the prediction less the workspaces."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from planner import memory as mem
from planner.cost.step import CostModel
from planner.plan import Plan

GIB = mem.GIB


@dataclass
class MemoryParts:
    """Bytes of one rank by part; `other_state` is what the simulation finds alive at a step's start that is
    neither weights, gradients nor optimizer state (the planner predicts none)."""
    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    other_state: float = 0.0
    activations: float = 0.0
    temporaries: float = 0.0

    @property
    def tensor_bytes(self) -> float:
        return sum(asdict(self).values())

    def gib(self) -> dict[str, float]:
        return {k: v / GIB for k, v in asdict(self).items()}


def _state_split(params: float, lay, shard_ranks: int, grad: float, full_grads: bool,
                 sharded_grads: bool) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of `params` elements (planner/memory/model.py state_parts_per_param)."""
    w, g, o = mem.state_parts_per_param(lay.sharding, shard_ranks, grad, full_grads, sharded_grads)
    return params * w, params * g, params * o


def predicted_parts(cm: CostModel, plan: Plan, pp_rank: int) -> MemoryParts:
    """The planner's memory of pipeline rank `pp_rank` of `plan`, by part (see the module docstring)."""
    lay = cm.lay
    rank_stages = [(j, plan.stages[j]) for j in cm.rank_chunks(pp_rank)]
    dense, expert = cm.rank_params(rank_stages)
    g = mem.grad_bytes(lay)
    dw, dg, do = _state_split(dense, lay, lay.dp * lay.cp, g, cm.zero2_full_grads, cm.fsdp_grads_at_peak)
    ew, eg, eo = _state_split(expert, lay, mem.expert_shard_ranks(lay, cm.target.expert_states_over_tp), g,
                              cm.zero2_full_grads, cm.fsdp_grads_at_peak)
    static, per_mb = cm.rank_memory_parts(rank_stages)
    acts = mem.peak_in_flight_bytes(cm.in_flight_peaks(pp_rank, cm.num_micro), per_mb)
    workspace = mem.cublas_workspace_bytes(lay, cm.cluster.gpu)
    state = dw + dg + do + ew + eg + eo
    return MemoryParts(weights=dw + ew, gradients=dg + eg, optimizer=do + eo, activations=acts,
                       temporaries=static - state - workspace)
