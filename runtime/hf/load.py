"""Load a Hugging Face checkpoint folder into this rank's stages: each rank reads only the slices it holds.

Each runtime parameter's logical tensor is made of Pieces (runtime/hf/names.py); this rank's shard of it is chunk
`tp_rank` of every Piece along the parameter's TP dimension (runtime/parallel/tensor.py, local_shard), read with
safetensors' `get_slice`, so a rank reads its pipeline stage's layers, its experts (named by their global index) and
its TP rows or columns, nothing else. Padded vocabulary rows are zeros. Every check (runtime/hf/checks.py) and every
shape runs before the first weight is read."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors import safe_open

from planner.errors import PlanError
from runtime.hf.checks import CheckedFolder, check_folder, refuse_shared_kv_layout, refuse_unused_tensors
from runtime.hf.names import Piece, hf_sources
from runtime.model import logical_name
from runtime.parallel.tensor import group_rank, group_size


@dataclass(frozen=True)
class PieceRead:
    """One read: the [lo, hi) range, along dimension `dim` of the runtime's orientation, of one Piece."""
    piece: Piece
    dim: int
    lo: int
    hi: int


def _plain(p) -> torch.Tensor:
    """The parameter's local tensor (a DTensor's local shard under FSDP)."""
    return p.to_local() if hasattr(p, "to_local") else p


def _full_shape(p, t: int) -> list[int]:
    shape = list(_plain(p).shape)
    if p.tp_dim is not None:
        shape[p.tp_dim] *= t
    return shape


def plan_reads(p, pieces: tuple[Piece, ...], t: int, r: int) -> list[PieceRead]:
    """The reads that make TP rank r's shard of parameter p, in order along its TP dimension."""
    full = _full_shape(p, t)
    dim = p.tp_dim if p.tp_dim is not None else 0
    parts = p.tp_parts or [full[dim]]
    if len(parts) != len(pieces):
        raise ValueError(f"{len(pieces)} Hugging Face pieces for {len(parts)} fused parts")
    if p.tp_dim is None or t == 1:
        return [PieceRead(pc, dim, 0, n) for pc, n in zip(pieces, parts)]
    return [PieceRead(pc, dim, r * (n // t), (r + 1) * (n // t)) for pc, n in zip(pieces, parts)]


def _oriented_shape(shape: tuple[int, ...], piece: Piece) -> list[int]:
    return list(reversed(shape)) if piece.transpose else list(shape)


def check_shapes(name: str, p, pieces: tuple[Piece, ...], folder: CheckedFolder, t: int) -> None:
    """Refuse, in one sentence, a checkpoint tensor that is absent or whose shape does not make parameter `name`."""
    full = _full_shape(p, t)
    dim = p.tp_dim if p.tp_dim is not None else 0
    parts = p.tp_parts or [full[dim]]
    for pc, n in zip(pieces, parts):
        if pc.hf_name not in folder.shapes:
            raise PlanError(f"checkpoint folder '{folder.root}' lacks the tensor '{pc.hf_name}' that the plan's model "
                            "needs")
        shape = _oriented_shape(folder.shapes[pc.hf_name], pc)
        rows = (pc.rows[1] - pc.rows[0]) if pc.rows else shape[0]
        if pc.rows and pc.rows[1] > shape[0]:
            rows = -1
        got = [rows] + shape[1:]
        want = list(full)
        want[dim] = n
        ok = got == want or (pc.pad_rows and dim == 0 and got[1:] == want[1:] and 0 < rows <= pc.pad_rows)
        if not ok:
            raise PlanError(f"checkpoint tensor '{pc.hf_name}' has shape {list(folder.shapes[pc.hf_name])}, which does "
                            f"not make the plan's {name} of shape {full}")


def read_piece(handle, rd: PieceRead) -> torch.Tensor:
    """The [lo, hi) range along rd.dim of a Piece (zero rows past a padded tensor's end), runtime orientation."""
    pc = rd.piece
    sl = handle.get_slice(pc.hf_name)
    shape = _oriented_shape(tuple(sl.get_shape()), pc)
    r0, r1 = pc.rows or (0, shape[0])
    if rd.dim == 0:
        lo, hi = min(r0 + rd.lo, r1), min(r0 + rd.hi, r1)
        ranges = [(lo, hi)] + [(0, n) for n in shape[1:]]
    else:
        ranges = [(r0, r1), (rd.lo, rd.hi)] + [(0, n) for n in shape[2:]]
    if ranges[0][1] <= ranges[0][0]:
        got = torch.empty([0] + [b - a for a, b in ranges[1:]])
    else:
        index = [slice(a, b) for a, b in ranges]
        got = sl[tuple(reversed(index)) if pc.transpose else tuple(index)]
        got = got.t() if pc.transpose else got
    if rd.dim == 0 and got.shape[0] < rd.hi - rd.lo:  # padded vocabulary rows
        pad = torch.zeros([rd.hi - rd.lo - got.shape[0]] + list(got.shape[1:]), dtype=got.dtype)
        got = torch.cat([got, pad], dim=0)
    return got


def _stage_params(stages):
    for stage in stages:
        for name, p in stage.named_parameters():
            yield logical_name(name, p), p


@torch.no_grad()
def load_hf_weights(stages, plan, groups, hf_dir) -> CheckedFolder:
    """Fill every parameter of this rank's `stages` from the Hugging Face checkpoint folder hf_dir.

    Call it after the stages are built and before the optimizer takes its master copy of the parameters. Each rank
    reads its own slices; no collective runs. Refuses, before any weight is read, what runtime/hf/checks.py refuses,
    a tensor the model needs that the folder lacks, and a tensor of the wrong shape.
    Returns the checked folder (its config is what save_hf_weights writes back)."""
    refuse_shared_kv_layout(plan.model, group_size(groups.tp))
    folder = check_folder(hf_dir, plan.model)
    sources = hf_sources(plan.model, folder.model_type)
    refuse_unused_tensors(folder, {pc.hf_name for pieces in sources.values() for pc in pieces})
    t, r = group_size(groups.tp), group_rank(groups.tp)
    todo = []
    for name, p in _stage_params(stages):
        if name not in sources:
            raise PlanError(f"the runtime's parameter {name} has no tensor in a '{folder.model_type}' checkpoint")
        check_shapes(name, p, sources[name], folder, t)
        todo.append((p, plan_reads(p, sources[name], t, r)))
    handles = {}
    try:
        for p, reads in todo:
            pieces = []
            for rd in reads:
                path = folder.files[rd.piece.hf_name]
                if path not in handles:
                    handles[path] = safe_open(str(path), framework="pt")
                pieces.append(read_piece(handles[path], rd))
            dim = p.tp_dim if p.tp_dim is not None else 0
            local = _plain(p)
            local.copy_(torch.cat(pieces, dim=dim).to(local.dtype))
    finally:
        handles.clear()
    return folder
