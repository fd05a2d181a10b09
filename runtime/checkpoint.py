"""Checkpoints with torch.distributed.checkpoint (DCP), in logical (TP1, unsharded) tensor names and shapes.

Each rank writes the TP-local piece of every tensor it holds as a DTensor over the TP mesh (Shard on
the TP dimension of each fused part, Replicate otherwise); data-parallel replicas are deduplicated by
DCP's planner, pipeline stages write disjoint names (layers are keyed by global index). Because names
and shapes are logical, a checkpoint loads under any other plan: DCP reads, for each rank, exactly the
slices its new DTensors cover (TP2 saved, DP2 resumed; any sharding level).

Saved per parameter (fp32): master/<name>, exp_avg/<name>, exp_avg_sq/<name>; fused parameters (qkv,
gate/up) are saved as their logical parts (<name>.part0, .part1, ...). Plus `step` and `adam_step`.
Data needs no state: batches are a function of the step. Layout: DIR/step-00000100/ (DCP files) and
DIR/latest (the step number, written after a save completes). A step directory that exists is never
overwritten.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor, Replicate, Shard

from planner.errors import PlanError
from runtime.model import logical_name
from runtime.parallel.tensor import group_size, logical_parts

KEYS = ("master", "exp_avg", "exp_avg_sq")


class CheckpointError(PlanError):
    pass


def step_dir(ckpt_dir, step: int) -> Path:
    return Path(ckpt_dir) / f"step-{step:08d}"


def latest_step(ckpt_dir) -> int | None:
    f = Path(ckpt_dir) / "latest"
    if not f.exists():
        return None
    try:
        return int(f.read_text().strip())
    except ValueError:
        raise CheckpointError(f"'{f}' does not hold a step number") from None


def _contiguous_stride(shape):
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= s
    return tuple(reversed(stride))


def _as_dtensor(local: torch.Tensor, tp_dim, t: int, mesh):
    if mesh is None:
        return local
    shape = list(local.shape)
    if tp_dim is not None:
        shape[tp_dim] *= t
    placement = [Shard(tp_dim)] if tp_dim is not None else [Replicate()]
    return DTensor.from_local(local, mesh, placement, run_check=False, shape=torch.Size(shape),
                              stride=_contiguous_stride(shape))


def save(ckpt_dir, step: int, opt, groups) -> Path:
    path = step_dir(ckpt_dir, step)
    if path.exists():
        raise CheckpointError(f"checkpoint '{path}' already exists; refusing to overwrite it")
    if dist.is_initialized():
        dist.barrier()  # every rank has checked before anyone writes
    mesh = groups.cpu_tp_mesh
    t = group_size(groups.tp)
    state = {}
    for name, p, tensors in opt.full_local_state():
        if getattr(p, "tied_copy", False):
            continue
        lname = logical_name(name, p)
        for key in KEYS:
            parts = logical_parts(tensors[key], p.tp_dim, p.tp_parts, t)
            for i, part in enumerate(parts):
                k = f"{key}/{lname}" + (f".part{i}" if len(parts) > 1 else "")
                state[k] = _as_dtensor(part.detach().float().cpu().contiguous(), p.tp_dim, t, mesh)
    state["step"] = torch.tensor(step)
    state["adam_step"] = torch.tensor(opt.step_count)
    dcp.save(state, checkpoint_id=str(path))
    if not dist.is_initialized() or dist.get_rank() == 0:
        tmp = Path(ckpt_dir) / "latest.tmp"
        tmp.write_text(f"{step}\n")
        tmp.replace(Path(ckpt_dir) / "latest")
    if dist.is_initialized():
        dist.barrier()
    return path


def load(ckpt_dir, opt, groups, step: int | None = None) -> int:
    """Load into the optimizer (master, Adam state) and the model parameters; returns the step."""
    step = latest_step(ckpt_dir) if step is None else step
    if step is None:
        raise CheckpointError(f"no checkpoint in '{ckpt_dir}' to resume from")
    path = step_dir(ckpt_dir, step)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    mesh = groups.cpu_tp_mesh
    t = group_size(groups.tp)
    state, views = {}, {}
    for name, p in opt.named_params():
        lname = logical_name(name, p)
        shape = tuple(p.shape)  # TP-local, data-parallel unsharded
        views[name] = {}
        for key in KEYS:
            local = torch.empty(shape, dtype=torch.float32)
            parts = logical_parts(local, p.tp_dim, p.tp_parts, t)
            pieces = []
            for i, part in enumerate(parts):
                k = f"{key}/{lname}" + (f".part{i}" if len(parts) > 1 else "")
                buf = torch.empty(part.shape, dtype=torch.float32)
                state[k] = _as_dtensor(buf, p.tp_dim, t, mesh)
                pieces.append(buf)
            views[name][key] = pieces
    state["step"] = torch.tensor(0)
    state["adam_step"] = torch.tensor(0)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:
        raise CheckpointError(f"checkpoint '{path}' does not fit this model ({str(exc).splitlines()[0][:200]})") from None
    dev = opt.named_params()[0][1].device
    params = dict(opt.named_params())
    states = {}
    for name, per_key in views.items():
        p = params[name]
        dim = p.tp_dim if p.tp_dim is not None else 0
        states[name] = {k: torch.cat(v, dim=dim).to(dev) if len(v) > 1 else v[0].to(dev) for k, v in per_key.items()}
    opt.load_full_local_state(states, int(state["adam_step"]))
    return int(state["step"])
