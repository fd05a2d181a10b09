"""Simulate one rank of a plan: build its real program with the runtime's own code in a fake world, run a few
training steps, and set what it held and sent beside the planner's prediction.

Call `simulate_rank` in a fresh process (`python -m runtime.simulate`, one process per rank): the fake process
group is the process's default group, and runtime/simulate/fake_world.py patches module attributes for the run.
One step is traced by default: every state tensor of the distributed optimizer exists once it is built, and what
the first step builds lazily (its segment views and scalars) is bytes. Under 'full' (FSDP2) torch's AdamW creates
its m and v in the first step, so the second step is traced (traced_steps). With more steps the last one is traced.

Where the simulated step differs from a GPU step (CPU_SIDE_BRANCHES): branches on `tensor.is_cuda` take their
CPU side, which changes no tensor the planner counts except where listed there.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from planner.plan import Plan

CPU_SIDE_BRANCHES = (
    "runtime/attention.py: GQA goes to scaled_dot_product_attention with enable_gqa on both sides (same tensors kept)",
    "runtime/parallel/router.py: the router's logits GEMM runs on transient fp32 copies of x and W (x is kept as "
    "it is for backward, as on CUDA)",
    "runtime/parallel/distributed_optimizer.py: no side stream for the bucket norms (no memory change)",
    "runtime/parallel/fp8.py: no compute-capability check (check_fp8_device passes on CPU)",
)


@dataclass
class CollectiveRow:
    kind: str
    group: str
    """The runtime group it ran on (a ParallelGroups field, see group_names), or its size."""
    group_size: int
    count: int
    traced_bytes: int
    predicted_bytes: float | None = None


@dataclass
class RankResult:
    rank: int
    stage: int
    """Pipeline rank (its chunks are stages stage, stage + pp, ...)."""
    coordinates: dict
    traced: dict
    """Bytes by part at the traced step's peak (runtime/simulate/tracker.py PARTS)."""
    predicted: dict
    """Bytes by part the planner predicts (runtime/simulate/memory.py)."""
    predicted_total_gib: float
    """The planner's figure for the rank (cuBLAS workspaces included; its allowance for memory outside the
    allocator and fragmentation is not part of it)."""
    collectives: list = field(default_factory=list)
    seconds: float = 0.0
    build_seconds: float = 0.0
    cpu_seconds: float = 0.0
    """This process's CPU time (wall time less what other processes took of a shared machine)."""

    @property
    def traced_tensor_gib(self) -> float:
        return sum(self.traced.values()) / 2**30

    @property
    def predicted_tensor_gib(self) -> float:
        return sum(self.predicted.values()) / 2**30


def _classifier(opt):
    """storage id -> part for the optimizer's state: its flat buffers (DistributedOptimizer) or its parameters,
    their gradients and torch's AdamW state (FullyShardedOptimizer)."""
    kinds: dict[int, str] = {}

    from runtime.simulate.tracker import storages_of

    def add(tensors, part):
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for storage in storages_of(t):
                    kinds[id(storage)] = part

    for buf in getattr(opt, "buffers", None) or []:
        add([buf.param_data], "weights")
        add([buf.main_grad, *buf.grad_shard], "gradients")
        add([*buf.master, *buf.m, *buf.v], "optimizer")
    inner = getattr(opt, "opt", None)
    if inner is not None:
        for group in inner.param_groups:
            add(group["params"], "weights")
            add([p.grad for p in group["params"]], "gradients")
        for state in inner.state.values():
            add(state.values(), "optimizer")
    return kinds.get


def _micro_batches(plan: Plan, groups, device):
    from runtime.data import open_source, step_micro_batches

    spec, lay, shape = plan.model, plan.layout, plan.training
    source = open_source("synthetic", spec.vocab_size, shape.seq_len, None, seed=0)
    mbs = step_micro_batches(source, spec.family, spec.vocab_size, shape.seq_len, shape.global_batch,
                             lay.micro_batch, lay.dp, groups.dp_rank, 0, lay.cp, groups.cp_rank, seed=0)
    return [{k: v.to(device) for k, v in mb.items()} for mb in mbs]


def _build(plan: Plan, groups, device):
    from runtime.parallel.data_parallel import GRAD_DTYPES, AdamConfig, build_optimizer
    from runtime.train import build_rank_stages

    lay = plan.layout
    stages = build_rank_stages(plan, groups, device, lay.overlap_tp, seed=0)
    opt = build_optimizer(stages, groups, lay.sharding, AdamConfig(), torch.bfloat16, lay.overlap_dp,
                          grad_dtype=GRAD_DTYPES[lay.grad_dtype])
    return stages, opt


def traced_steps(plan: Plan, steps: int) -> int:
    """Steps to run so that the last holds every state tensor: at least two under 'full', whose AdamW state
    (torch.optim.AdamW on FSDP2's sharded parameters) exists only from the first step's end."""
    return max(steps, 2) if plan.layout.sharding == "full" else steps


def trace_rank(plan: Plan, rank: int, steps: int = 1):
    """(tracker, groups, seconds to build) of `steps` fake training steps of `rank` (traced_steps: at least two
    under 'full'), the last one traced."""
    steps = traced_steps(plan, steps)
    from runtime.mesh import build_groups
    from runtime.simulate.fake_world import fake_device, fake_world
    from runtime.simulate.tracker import StepTracker
    from runtime.step import select_train_step

    fake_world(rank, plan.layout.world_size)
    groups = build_groups(plan.layout, "cpu")
    if plan.layout.pp > 1 and plan.model.tie_embeddings:  # formed now, so that its collectives are named
        from runtime.parallel.pipeline import _embedding_group

        _embedding_group(groups)
    device = torch.device("cpu")
    tracker = StepTracker(group_names(groups))
    t0 = time.perf_counter()
    with fake_device(), tracker, tracker.saved_tensors_hooks():
        stages, opt = _build(plan, groups, device)
        for st in stages:
            tracker.keep_outputs(st)
        mbs = _micro_batches(plan, groups, device)
        built = time.perf_counter() - t0
        step = select_train_step(plan.layout)
        for i in range(steps):
            if i == steps - 1:
                tracker.begin_step(_classifier(opt))
            step(stages, mbs, opt, groups, 1e-4)
        tracker.end_step()
    return tracker, groups, built


def step_rank(plan: Plan, rank: int, steps: int = 1) -> None:
    """Build `rank`'s program as trace_rank does and run `steps` fake training steps, untraced (no tracker hooks, and
    one step under 'full' too): whether the rank can be built and stepped at all. Leaves the fake world joined (the
    caller destroys the process group before the next rank)."""
    from runtime.mesh import build_groups
    from runtime.simulate.fake_world import fake_device, fake_world
    from runtime.step import select_train_step

    fake_world(rank, plan.layout.world_size)
    groups = build_groups(plan.layout, "cpu")
    device = torch.device("cpu")
    with fake_device():
        stages, opt = _build(plan, groups, device)
        mbs = _micro_batches(plan, groups, device)
        step = select_train_step(plan.layout)
        for _ in range(steps):
            step(stages, mbs, opt, groups, 1e-4)


GROUP_FIELDS = ("tp", "cp", "dp_cp", "pp", "ep", "expert_dp", "cp_tp", "dp")
"""ParallelGroups fields named in the collectives' table, in order of precedence where two are one group."""


def group_names(groups) -> dict[str, str]:
    """ProcessGroup.group_name -> its field in ParallelGroups (the first of GROUP_FIELDS that holds it), and the
    tied embedding's group (first and last pipeline stage, runtime/parallel/pipeline.py) as 'embedding' once the
    rank's pipeline has formed it."""
    from runtime.parallel.pipeline import _EMB_GROUPS

    names: dict[str, str] = {}
    for f in GROUP_FIELDS:
        g = getattr(groups, f, None)
        if g is not None and g.size() > 1:
            names.setdefault(g.group_name, f)
    emb = _EMB_GROUPS.get(id(groups))
    if emb is not None and hasattr(emb, "group_name"):  # a middle stage's rank is no member (new_group's marker)
        names.setdefault(emb.group_name, "embedding")
    return names


def _group_dims(lay) -> dict[str, int]:
    return {"tp": lay.tp, "cp": lay.cp, "dp_cp": lay.dp * lay.cp, "pp": lay.pp, "ep": lay.ep,
            "expert_dp": lay.dp * lay.cp // lay.ep}


def simulate_rank(plan: Plan, rank: int, steps: int = 1) -> RankResult:
    """Simulate `rank` of `plan` (in a fresh process) and set it beside the planner's prediction."""
    from planner import memory as mem
    from runtime.mesh import coordinates
    from runtime.simulate.memory import predicted_parts
    from runtime.simulate.predict import cost_model, predicted_collectives

    t0, c0 = time.perf_counter(), time.process_time()
    tracker, groups, built = trace_rank(plan, rank, steps)
    lay = plan.layout
    coords = coordinates(rank, lay)
    cm = cost_model(plan)
    pred = predicted_parts(cm, plan, coords["pp_rank"])
    total = pred.tensor_bytes + mem.cublas_workspace_bytes(cm.lay, cm.cluster.gpu)
    expected = predicted_collectives(cm, plan, coords["pp_rank"])
    rows = []
    for (kind, group), rec in sorted(tracker.collectives.items()):
        rows.append(CollectiveRow(kind, group, rec.group_size, rec.count, rec.bytes, expected.pop((kind, group), None)))
    dims = _group_dims(lay)
    for (kind, group), b in sorted(expected.items()):  # priced but never issued
        rows.append(CollectiveRow(kind, group, dims.get(group, 0), 0, 0, b))
    return RankResult(rank=rank, stage=coords["pp_rank"], coordinates=coords, traced=dict(tracker.peak.parts),
                      predicted={k: float(v) for k, v in vars(pred).items()}, predicted_total_gib=total / 2**30,
                      collectives=rows, seconds=time.perf_counter() - t0, build_seconds=built,
                      cpu_seconds=time.process_time() - c0)
