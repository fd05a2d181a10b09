"""Process groups from a plan's Layout.

Rank order (what the planner prices): tensor-parallel ranks adjacent, then context, then data, then pipeline:

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

which is exactly a row-major DeviceMesh of shape (pp, dp, cp, tp). We use PyTorch's `init_device_mesh`
for the four dimensions and the flattened dp*cp dimension (gradient reduction, optimizer sharding, FSDP);
expert groups (ep, expert-dp) are drawn from the dp*cp ranks, `ep` consecutive ones per expert group
(as Megatron-Core), and built with `new_group` because a DeviceMesh cannot express a split of a
flattened dimension with a stable public API. Nothing here is global state: callers pass `ParallelGroups`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from planner.plan import Layout


def init_distributed(cuda: bool, timeout_min: float = 10) -> int:
    """The torchrun worker's default process group: NCCL for CUDA tensors with a gloo side for CPU ones
    (checkpoint staging), or gloo alone on CPU. Returns the local rank (its GPU on CUDA)."""
    import datetime
    import os

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(minutes=timeout_min)
    if cuda:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=torch.device("cuda", local_rank), timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return local_rank


@dataclass
class ParallelGroups:
    layout: Layout
    mesh: DeviceMesh | None
    """The (pp, dp, cp, tp) mesh; None in a single process without torch.distributed."""
    tp: dist.ProcessGroup | None
    cp: dist.ProcessGroup | None
    dp: dist.ProcessGroup | None
    pp: dist.ProcessGroup | None
    dp_cp: dist.ProcessGroup | None
    """Gradient reduction and optimizer sharding group (data x context ranks)."""
    ep: dist.ProcessGroup | None
    expert_dp: dist.ProcessGroup | None
    """Ranks holding the same experts: expert gradients are reduced over it."""
    dp_cp_mesh: DeviceMesh | None
    tp_mesh: DeviceMesh | None
    cpu_tp_mesh: DeviceMesh | None = None
    """A gloo (CPU) mesh over the same TP ranks: checkpoints stage tensors through host memory."""
    cp_tp: dist.ProcessGroup | None = None
    """The context x tensor ranks of one (pp, dp) coordinate: together they hold one micro-batch's sequences,
    each a shard of them (MoE load-balancing statistics are summed over it)."""
    rank: int = 0
    tp_rank: int = 0
    cp_rank: int = 0
    dp_rank: int = 0
    pp_rank: int = 0
    ep_rank: int = 0
    expert_dp_rank: int = 0

    @property
    def tp_size(self) -> int:
        return self.layout.tp

    @property
    def cp_size(self) -> int:
        return self.layout.cp

    @property
    def dp_cp_size(self) -> int:
        return self.layout.dp * self.layout.cp

    @property
    def dp_cp_rank(self) -> int:
        return self.cp_rank + self.layout.cp * self.dp_rank


def coordinates(rank: int, lay: Layout) -> dict[str, int]:
    """Coordinates of a global rank (pure arithmetic; the planner's order)."""
    tp_rank = rank % lay.tp
    cp_rank = (rank // lay.tp) % lay.cp
    dp_rank = (rank // (lay.tp * lay.cp)) % lay.dp
    pp_rank = rank // (lay.tp * lay.cp * lay.dp)
    i = cp_rank + lay.cp * dp_rank
    return dict(tp_rank=tp_rank, cp_rank=cp_rank, dp_rank=dp_rank, pp_rank=pp_rank,
                ep_rank=i % lay.ep, expert_dp_rank=i // lay.ep)


def expert_rank_lists(lay: Layout) -> tuple[list[list[int]], list[list[int]]]:
    """(ep groups, expert-dp groups) as lists of global ranks, for every (pp, tp) coordinate."""
    ep_groups, edp_groups = [], []
    n = lay.dp * lay.cp
    for pp_rank in range(lay.pp):
        for tp_rank in range(lay.tp):
            ranks = [tp_rank + lay.tp * (i + n * pp_rank) for i in range(n)]  # dp_cp index i = cp + cp*dp
            ep_groups += [ranks[j:j + lay.ep] for j in range(0, n, lay.ep)]
            edp_groups += [ranks[e::lay.ep] for e in range(lay.ep)]
    return ep_groups, edp_groups


def single_process_groups(lay: Layout | None = None) -> ParallelGroups:
    """Groups for a single process without torch.distributed (tests, the reference run)."""
    lay = lay or Layout(tp=1, pp=1, dp=1, cp=1, sharding="none")
    assert lay.world_size == 1, "single_process_groups needs a world of one"
    return ParallelGroups(lay, None, None, None, None, None, None, None, None, None, None)


def build_groups(lay: Layout, device_type: str) -> ParallelGroups:
    """Every rank calls this with the same layout after init_process_group."""
    world = dist.get_world_size()
    if world != lay.world_size:
        raise ValueError(f"the plan needs {lay.world_size} processes but {world} were started")
    rank = dist.get_rank()
    mesh = init_device_mesh(device_type, (lay.pp, lay.dp, lay.cp, lay.tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    dp_cp_mesh = mesh["dp", "cp"]._flatten("dp_cp")
    cp_tp = mesh["cp", "tp"]._flatten("cp_tp").get_group()
    ep_lists, edp_lists = expert_rank_lists(lay)
    ep = edp = None
    if lay.ep > 1:  # every rank creates every group, in the same order (new_group's contract)
        for ranks in ep_lists:
            g = dist.new_group(ranks)
            if rank in ranks:
                ep = g
        for ranks in edp_lists:
            g = dist.new_group(ranks)
            if rank in ranks:
                edp = g
    else:
        edp = dp_cp_mesh.get_group()
    c = coordinates(rank, lay)
    cpu_tp_mesh = mesh["tp"]
    if device_type != "cpu":  # needs init_process_group(backend="cuda:nccl,cpu:gloo")
        cpu_tp_mesh = init_device_mesh("cpu", (lay.pp, lay.dp, lay.cp, lay.tp),
                                       mesh_dim_names=("pp", "dp", "cp", "tp"))["tp"]
    return ParallelGroups(
        layout=lay, mesh=mesh, tp=mesh.get_group("tp"), cp=mesh.get_group("cp"), dp=mesh.get_group("dp"),
        pp=mesh.get_group("pp"), dp_cp=dp_cp_mesh.get_group(), ep=ep, expert_dp=edp,
        dp_cp_mesh=dp_cp_mesh, tp_mesh=mesh["tp"], cpu_tp_mesh=cpu_tp_mesh, cp_tp=cp_tp,
        rank=rank, **c)
