"""Write this run's weights as a Hugging Face checkpoint folder: config.json, safetensors shards and their index,
which `transformers` loads with no missing or unexpected key.

The TP shards of each parameter are gathered to the group's TP rank 0 (runtime/parallel/tensor.py,
gather_logical); the writers are the ranks of TP rank 0 and data-parallel index 0 (for expert weights: expert-data
index 0, one per expert-parallel rank), one shard file each, so a pipeline stage's layers and an EP rank's experts are
written by the rank that holds them. The folder is written under '<out_dir>.partial' and renamed when complete; an
existing out_dir is refused, never overwritten."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from planner.errors import PlanError, read_json
from runtime.hf.checks import INDEX_NAME, compare_spec, refuse_shared_kv_layout
from runtime.hf.names import Piece, hf_sources
from runtime.model import logical_name
from runtime.parallel.tensor import gather_logical, group_rank, group_size


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _full_local(p) -> torch.Tensor:
    """The TP-local tensor of p (a DTensor gathered over its data-parallel shards under FSDP)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def hf_tensors(name: str, logical: torch.Tensor, p, pieces: tuple[Piece, ...], vocab: int) -> list[tuple]:
    """(hf_name, rows, tensor) for each Piece of a logical tensor: the part in the Hugging Face orientation less the
    padded vocabulary rows; rows is the part's row range inside a fused Hugging Face tensor (None: the whole)."""
    dim = p.tp_dim if p.tp_dim is not None else 0
    parts = logical.split(p.tp_parts or [logical.shape[dim]], dim=dim)
    out = []
    for pc, part in zip(pieces, parts):
        if pc.pad_rows:
            part = part[:vocab]
        out.append((pc.hf_name, pc.rows, part.t() if pc.transpose else part, pc.transpose))
    return out


def assemble(found: list[tuple]) -> dict[str, torch.Tensor]:
    """One tensor per Hugging Face name, the row ranges of fused ones put in order."""
    by_name: dict[str, list] = {}
    for hf_name, rows, tensor, transpose in found:
        by_name.setdefault(hf_name, []).append((rows[0] if rows else 0, tensor, transpose))
    out = {}
    for hf_name, items in by_name.items():
        items.sort(key=lambda x: x[0])
        dim = 1 if items[0][2] else 0
        out[hf_name] = torch.cat([x[1] for x in items], dim=dim).detach().to("cpu").contiguous()
    return out


def _writer_of(p, groups) -> bool:
    """Whether this rank writes parameter p: TP rank 0 of the data-parallel (expert-data for experts) index 0."""
    if group_rank(groups.tp) != 0:
        return False
    if getattr(p, "expert", False):
        return groups.expert_dp_rank == 0
    return groups.dp_cp_rank == 0


@torch.no_grad()
def collect_tensors(stages, plan, groups, model_type: str) -> dict[str, torch.Tensor]:
    """The Hugging Face tensors this rank writes (every rank of a TP group takes part in the gathers)."""
    sources = hf_sources(plan.model, model_type)
    found = []
    for stage in stages:
        for name, p in stage.named_parameters():
            if getattr(p, "tied_copy", False):  # the first stage writes the tied embedding
                continue
            logical = gather_logical(_full_local(p), p.tp_dim, p.tp_parts, groups.tp)
            if _writer_of(p, groups):
                lname = logical_name(name, p)
                found += hf_tensors(lname, logical, p, sources[lname], plan.model.vocab_size)
    return assemble(found)


def _refuse_existing(out_dir: Path) -> None:
    if out_dir.exists() or out_dir.is_symlink():
        raise PlanError(f"'{out_dir}' exists; parallel-plan writes a Hugging Face checkpoint only into a new folder")


def save_hf_weights(stages, plan, groups, out_dir, config) -> Path:
    """Write this run's weights to the new folder out_dir as a Hugging Face checkpoint (every rank calls it).

    Args:
        config: the model's Hugging Face config (a dict, or a path to its config.json: the --init-from folder's, or
            the one the plan was made from); checked against plan.model, field by field, before anything is written,
            and written as out_dir/config.json with dtype set to the weights'.
    Returns: out_dir."""
    out_dir = Path(out_dir)
    cfg = read_json(config, "Hugging Face config") if not isinstance(config, dict) else dict(config)
    _refuse_existing(out_dir)
    partial = out_dir.with_name(out_dir.name + ".partial")
    check_config(cfg, plan)
    refuse_shared_kv_layout(plan.model, group_size(groups.tp))
    rank = dist.get_rank() if _distributed() else 0
    world = dist.get_world_size() if _distributed() else 1
    tensors = collect_tensors(stages, plan, groups, str(cfg.get("model_type", "")).lower())
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    if _distributed():
        dist.barrier()
    writers = sorted(set(_all_gather((rank, bool(tensors)), world)), key=lambda x: x[0])
    writer_ranks = [r for r, has in writers if has]
    files = {}
    if tensors:
        k = writer_ranks.index(rank)
        fname = f"model-{k + 1:05d}-of-{len(writer_ranks):05d}.safetensors"
        save_file(tensors, str(partial / fname), metadata={"format": "pt"})
        files = {n: fname for n in tensors}
    weight_map = {}
    for part in _all_gather(files, world):
        weight_map.update(part)
    if rank == 0:
        dtype = next(iter(tensors.values())).dtype if tensors else torch.float32
        cfg["dtype"] = str(dtype).removeprefix("torch.")
        cfg.pop("torch_dtype", None)
        (partial / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        total = sum(int(os.path.getsize(partial / f)) for f in set(weight_map.values()))
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (partial / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        partial.rename(out_dir)
    if _distributed():
        dist.barrier()
    return out_dir


def check_config(cfg: dict, plan) -> None:
    """Refuse a config whose model is not the plan's (compare_spec reads a config.json: a private temporary copy)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(cfg))
        compare_spec(plan.model, path)


def _all_gather(obj, world: int) -> list:
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out
