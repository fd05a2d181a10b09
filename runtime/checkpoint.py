"""Checkpoints with torch.distributed.checkpoint (DCP), in logical (TP1, unsharded) tensor names and shapes.

Each rank writes the TP-local piece of every tensor it holds as a DTensor over the TP mesh (Shard on
the TP dimension of each fused part, Replicate otherwise); data-parallel replicas are deduplicated by
DCP's planner, pipeline stages write disjoint names (layers are keyed by global index). Because names
and shapes are logical, a checkpoint loads under any other plan: DCP reads, for each rank, exactly the
slices its new DTensors cover (TP2 saved, DP2 resumed; any sharding level).

Saved per parameter (fp32): master/<name>, exp_avg/<name>, exp_avg_sq/<name>; fused parameters (qkv,
gate/up) are saved as their logical parts (<name>.part0, .part1, ...). Plus `step` and `adam_step`.
Data needs no state: batches are a function of the step. Layout: DIR/step-00000100/ (DCP files, and
TRAINING_FILE: the learning-rate schedule and AdamW settings the run trained with, which a resume must match
unless told to override them) and DIR/latest (the step number, written after a save completes).

A save writes DIR/step-00000100.partial/ and renames it to its final name once every rank's data and DCP's
`.metadata` (written last, by rank 0) are on disk, then rewrites `latest`: a step directory under its final
name with its `.metadata` is complete. A run killed mid-save leaves a `.partial` directory (or, from saves
before this scheme, a step directory without `.metadata`): that is no checkpoint, resume skips it, and a save
that needs its name first moves it aside to NAME.incomplete. Nothing is deleted, and a complete step
directory is never overwritten.

Before the rename, rank 0 writes the step's manifest (runtime/manifest.py) last: the sha256 of every file, the
step, the plan's hash and the source tree. Resume takes the newest complete checkpoint that it can trust
(`step_failure`): a step folder of its own (not a symbolic link) that matches its manifest, checked before DCP
reads a byte (DCP unpickles `.metadata`), whose `.metadata` unpickles through an unpickler that knows only DCP's
metadata classes and names as storage only bare file names its manifest lists (so DCP opens no file outside the
folder). One that fails is named and passed over for the next older one; byte items (we save none) load with
weights_only.

A save never writes through a symbolic link planted in the folder: rank 0 creates the `.partial` folder itself
(a leftover of that name, link or not, is moved aside first), and `latest` is replaced through a temporary file
created exclusively without following links (a stale regular temporary file is removed first; a link there is
refused). A write that fails (a full disk) is one sentence naming the checkpoint to resume from.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.tensor import DTensor, Replicate, Shard

from planner.errors import PlanError, read_json
from planner.lr_schedule import OptimizerSettings, settings_from_dict
from planner.lr_schedule import to_argv as optimizer_argv
from runtime import manifest
from runtime.model import logical_name
from runtime.parallel.tensor import group_size, logical_parts

KEYS = ("master", "exp_avg", "exp_avg_sq")


class CheckpointError(PlanError):
    pass


PARTIAL = ".partial"
"""Suffix of the directory a save writes before renaming it to its step's name."""
INCOMPLETE = ".incomplete"
"""Suffix an interrupted save's leftover is moved aside to when a save needs its name."""
_STEP_NAME = re.compile(r"step-(\d{8})")
TRAINING_FILE = "training.json"
"""In each step directory: the optimizer settings (planner/lr_schedule.py) the run trained with, as JSON."""


def step_dir(ckpt_dir, step: int) -> Path:
    return Path(ckpt_dir) / f"step-{step:08d}"


LATEST = "latest"
"""The file naming the newest saved step, replaced atomically after each save."""


def latest_step(ckpt_dir) -> int | None:
    f = Path(ckpt_dir) / LATEST
    if not f.exists():
        return None
    if not f.is_file():
        raise CheckpointError(f"'{f}' is not a regular file; remove it (resume takes the newest complete checkpoint)")
    try:
        with open(f, "rb") as fh:
            return int(fh.read(64).decode("ascii").strip())
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"'{f}' does not hold a step number; fix or remove it "
                              "(resume takes the newest complete checkpoint)") from None


def is_complete(path) -> bool:
    """DCP's `.metadata` is written after every rank's data; a save renames its directory only after that."""
    return (Path(path) / ".metadata").is_file()


def complete_steps(ckpt_dir) -> list[int]:
    """Steps of the complete checkpoints in ckpt_dir, ascending (none where the folder does not exist)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    steps = []
    for p in d.iterdir():
        m = _STEP_NAME.fullmatch(p.name)
        if m and p.is_dir() and is_complete(p):
            steps.append(int(m.group(1)))
    return sorted(steps)


def incomplete_leftovers(ckpt_dir) -> list[Path]:
    """What interrupted saves left in ckpt_dir: `.partial` directories and step directories without `.metadata`."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.is_dir() and (
        p.name.endswith(PARTIAL) or (_STEP_NAME.fullmatch(p.name) and not is_complete(p))))


def check_dir(ckpt_dir, resume: bool, settings: OptimizerSettings | None = None, override: bool = False,
              full: bool = True, report=None) -> int | None:
    """Whether a run may use ckpt_dir, checked before it trains (by `plan launch`, and by every worker before it
    joins the process group, there with `full=False`: sizes and small files only). A fresh run needs a folder
    without checkpoints (its saves would fail after all its training, or mix two runs' steps under one
    `latest`); a resumed one a complete checkpoint that matches its manifest (`resume_step`), saved with the
    same optimizer `settings` unless `override`. `report(sentence)` hears of checkpoints passed over.
    Returns the step a resumed run starts from, None for a fresh run; raises CheckpointError."""
    d = Path(ckpt_dir)
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"--ckpt-dir '{d}' is a file, not a folder")
    check_writable_folder(d)
    steps = complete_steps(d)
    if not resume:
        if steps or (d / "latest").exists():
            held = f"checkpoints up to step {steps[-1]}" if steps else "a 'latest' file of an earlier run"
            raise CheckpointError(f"'{d}' already holds {held}; pass --resume to continue that run, "
                                  "or give another --ckpt-dir")
        return None
    latest_step(d)  # a 'latest' without a step number means a damaged folder: say so rather than guess past it
    step, note = resume_step(d, full)
    if note and report:
        report(note)
    if settings is not None and not override:
        _check_same_settings(step_dir(d, step), settings)
    return step


def _probe(folder: Path) -> bool:
    """Whether a file can be created (and is removed again) in `folder`: os.access answers "writable" to root in
    /proc or on a read-only disk."""
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-").close()
    except OSError:
        return False
    return True


def check_writable_folder(d: Path) -> None:
    """--ckpt-dir can take checkpoints: a writable folder, or one that can be made in a writable folder (found
    now by creating and removing a file there, not at the first save after a whole run)."""
    if d.is_dir():
        if not os.access(d, os.W_OK | os.X_OK) or not _probe(d):
            raise CheckpointError(f"--ckpt-dir '{d}' is not writable")
        return
    parent = d.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CheckpointError(f"--ckpt-dir '{d}' cannot be made: '{parent}' is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or not _probe(parent):
        raise CheckpointError(f"--ckpt-dir '{d}' cannot be made: '{parent}' is not writable")


def _failure(name: str, reason: str) -> str:
    if reason.startswith("it has no "):
        return f"checkpoint {name} has no {manifest.MANIFEST_FILE}"
    return f"checkpoint {name} fails its manifest ({reason})"


def _metadata_failure(folder: Path, metadata=None) -> str | None:
    """Why the verified `.metadata` of `folder` cannot be trusted (unpickled through the restricted unpickler
    unless `metadata` is given, and naming storage outside the manifest), as a sentence; None when it can."""
    if metadata is None:
        try:
            metadata = manifest.load_metadata((folder / ".metadata").read_bytes())
        except Exception as exc:  # a pickle that names a global we do not allow, or malformed bytes
            return f"checkpoint {folder.name}'s .metadata is not DCP metadata ({exc}); nothing in it was run"
    try:
        listed = manifest.read(folder)["files"]
    except ValueError as exc:
        return _failure(folder.name, str(exc))
    reason = manifest.storage_outside(getattr(metadata, "storage_data", None), listed)
    return f"checkpoint {folder.name} is not one DCP may read ({reason}); nothing was read" if reason else None


def step_failure(path: Path, full: bool = True) -> str | None:
    """Why the complete step folder `path` cannot be resumed from, as a sentence; None when it can: a folder of
    its own, matching its manifest (`full=False`: sizes and small files only), with trusted metadata."""
    if path.is_symlink():
        return f"checkpoint {path.name} is a symbolic link, not a folder of its own"
    reason = manifest.verify(path, full=full)
    if reason is not None:
        return _failure(path.name, reason)
    return _metadata_failure(path)


def resume_step(ckpt_dir, full: bool = True) -> tuple[int, str | None]:
    """The newest complete checkpoint that can be trusted (`step_failure`), and a sentence naming the newer ones
    passed over (None when none was). Raises CheckpointError when none can."""
    d = Path(ckpt_dir)
    steps = complete_steps(d)
    if not steps:
        raise CheckpointError(f"--resume found no complete checkpoint in '{d}' to resume from")
    failures = []
    for step in reversed(steps):
        path = step_dir(d, step)
        failure = step_failure(path, full)
        if failure is None:
            note = f"{'; '.join(failures)}; resuming from {path.name}" if failures else None
            return step, note
        failures.append(failure)
    newest = failures[0] + (f" and {len(failures) - 1} older one(s) fail too" if len(failures) > 1 else "")
    raise CheckpointError(f"{newest}: no checkpoint in '{d}' can be resumed from without reading files its "
                          "save did not write (runtime/README.md, Checkpoints)")


def _check_same_settings(path: Path, settings: OptimizerSettings) -> None:
    """A resumed run trains on with the schedule it was saved with: a changed one would jump the learning rate."""
    f = path / TRAINING_FILE
    if not f.is_file():
        return
    try:
        saved = read_json(f, "training settings")
    except PlanError:
        raise CheckpointError(f"'{f}' is not readable JSON; pass --override-lr-schedule to resume with this "
                              "launch's learning-rate schedule and AdamW settings") from None
    if saved != asdict(settings):
        try:
            was = " ".join(optimizer_argv(settings_from_dict(saved))) or "the defaults"
        except (TypeError, KeyError, PlanError):
            was = "settings this build cannot read"
        now = " ".join(optimizer_argv(settings)) or "the defaults"
        raise CheckpointError(f"checkpoint '{path}' was trained with {was}, this launch asks for {now}; give the "
                              "same options, or --override-lr-schedule to go on with the new ones")


def _move_aside(path: Path) -> Path:
    """An interrupted save's leftover out of a save's way: renamed, not deleted, in case it holds anything."""
    target = path.with_name(path.name + INCOMPLETE)
    n = 2
    while os.path.lexists(target):
        target = path.with_name(f"{path.name}{INCOMPLETE}-{n}")
        n += 1
    path.rename(target)
    print(f"note: moved '{path}', left incomplete by an interrupted save, to '{target}'", flush=True)
    return target


def _first_failure(exc: BaseException) -> str:
    """The first line of what went wrong; for DCP's CheckpointException (a BaseException holding each rank's
    exception), the first rank's own exception rather than its 'CheckpointException ranks:...' header."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    return (str(exc).splitlines() or [exc.__class__.__name__])[0][:200]


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


def save(ckpt_dir, step: int, opt, groups, settings: OptimizerSettings | None = None,
         plan_hash: str | None = None) -> Path:
    """Write step `step` to ckpt_dir/step-NNNNNNNN (through a `.partial` directory renamed when complete), with
    the optimizer `settings` in its TRAINING_FILE and its manifest last, then point `latest` at it. Every rank
    calls it."""
    path = step_dir(ckpt_dir, step)
    if is_complete(path) and not path.is_symlink():
        raise CheckpointError(f"checkpoint '{path}' already exists; refusing to overwrite it")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    partial = path.with_name(path.name + PARTIAL)
    made = [None]  # rank 0's sentence when it could not make the folder, told to every rank
    if rank0:
        made[0] = _make_partial(ckpt_dir, path, partial)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(made, src=0)  # also the barrier: leftovers are out of the way before any write
    if made[0]:
        raise CheckpointError(made[0])
    try:
        dcp.save(_state_to_save(step, opt, groups), checkpoint_id=str(partial))
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        raise CheckpointError(f"could not write checkpoint '{path}' ({_first_failure(exc)}); "
                              f"{_resume_hint(ckpt_dir)}") from None
    if rank0:
        try:
            if settings is not None:
                manifest.write_new(partial / TRAINING_FILE, json.dumps(asdict(settings), indent=2) + "\n")
            manifest.write(partial, step, plan_hash)
            partial.rename(path)  # dcp.save returns on every rank only after rank 0 wrote the metadata
            _write_latest(Path(ckpt_dir), step)
        except OSError as exc:
            raise CheckpointError(f"could not write checkpoint '{path}' ({exc.strerror or exc.__class__.__name__})"
                                  f"; {_resume_hint(ckpt_dir)}") from None
    if dist.is_initialized():
        dist.barrier()
    return path


def _resume_hint(ckpt_dir) -> str:
    """Which checkpoint a run whose save failed resumes from."""
    steps = [s for s in complete_steps(ckpt_dir) if not step_dir(ckpt_dir, s).is_symlink()]
    return (f"resume from '{step_dir(ckpt_dir, steps[-1])}' with --resume" if steps
            else "no earlier checkpoint was saved")


def _make_partial(ckpt_dir, path: Path, partial: Path) -> str | None:
    """Rank 0 makes the save's `.partial` folder itself (exclusively: a folder, a file or a link planted under
    that name is moved aside first, never written through); returns the sentence when it cannot."""
    try:
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
        for leftover in (path, partial):
            if os.path.lexists(leftover):
                _move_aside(leftover)
        os.mkdir(partial, 0o755)
    except OSError as exc:
        return (f"could not write checkpoint '{path}' ({exc.strerror or exc.__class__.__name__}); "
                f"{_resume_hint(ckpt_dir)}")
    return None


def _write_latest(ckpt_dir: Path, step: int) -> None:
    """Point `latest` at `step`: written to a temporary file created exclusively without following links, then
    renamed over `latest` (a rename replaces a link there, never its target). A stale temporary file of an
    interrupted save is removed first; a symbolic link in its place is refused."""
    tmp = ckpt_dir / (LATEST + ".tmp")
    if tmp.is_symlink():
        raise CheckpointError(f"'{tmp}' is a symbolic link, which a save never makes; remove it")
    if os.path.lexists(tmp):
        tmp.unlink()
    manifest.write_new(tmp, f"{step}\n")
    os.replace(tmp, ckpt_dir / LATEST)


def _state_to_save(step: int, opt, groups) -> dict:
    """Every tensor this rank saves, under its logical name (fp32, on the CPU)."""
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
    return state


def load(ckpt_dir, opt, groups, step: int | None = None) -> int:
    """Load into the optimizer (master, Adam state) and the model parameters; returns the step. Without `step`,
    the newest complete checkpoint that matches its manifest (rank 0 checks every file's sha256 and tells the
    others; each rank checks `.metadata` again itself right before DCP reads it)."""
    path = _verified_path(ckpt_dir, step)
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
    reader = _VerifiedReader(path)
    reader.check_metadata()  # this rank's own check, before DCP unpickles anything
    try:
        dcp.load(state, storage_reader=reader, planner=_WeightsOnlyLoadPlanner())
    except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
        raise CheckpointError(f"checkpoint '{path}' does not fit this model ({_first_failure(exc)})") from None
    dev = opt.named_params()[0][1].device
    params = dict(opt.named_params())
    states = {}
    for name, per_key in views.items():
        p = params[name]
        dim = p.tp_dim if p.tp_dim is not None else 0
        states[name] = {k: torch.cat(v, dim=dim).to(dev) if len(v) > 1 else v[0].to(dev) for k, v in per_key.items()}
    opt.load_full_local_state(states, int(state["adam_step"]))
    return int(state["step"])


def _verified_path(ckpt_dir, step: int | None) -> Path:
    """The step folder to load: rank 0 verifies every file against the manifest (falling back past failures when
    no `step` was asked for) and every rank takes its answer, so all raise the same sentence or load the same."""
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    answer = [None, None, None]  # step, note, error
    if rank0:
        try:
            if step is None:
                answer[0], answer[1] = resume_step(ckpt_dir)
            else:
                path = step_dir(ckpt_dir, step)
                failure = step_failure(path) if is_complete(path) else _failure(path.name, "it is incomplete or missing")
                if failure:
                    raise CheckpointError(failure)
                answer[0] = step
        except CheckpointError as exc:
            answer[2] = str(exc)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(answer, src=0)  # between this run's own ranks
    if answer[2]:
        raise CheckpointError(answer[2])
    if answer[1] and rank0:
        print(f"note: {answer[1]}", flush=True)
    return step_dir(ckpt_dir, answer[0])


class _VerifiedReader(dcp.FileSystemReader):
    """DCP's file reader with `.metadata` unpickled only after its sha256 matched the manifest, and only through
    runtime/manifest.py's restricted unpickler. DCP falls back to per-rank metadata files when the global one
    fails to read if read_metadata takes keyword arguments; this one takes none, so it never does."""

    def check_metadata(self) -> None:
        folder = Path(self.path)
        reason = manifest.verify_file(folder, ".metadata")
        if reason:
            raise CheckpointError(_failure(folder.name, reason))
        try:
            metadata = manifest.load_metadata((folder / ".metadata").read_bytes())
        except Exception as exc:  # a pickle that names a global we do not allow, or malformed bytes
            raise CheckpointError(f"checkpoint {folder.name}'s .metadata is not DCP metadata ({exc}); "
                                  "nothing in it was run") from None
        failure = _metadata_failure(folder, metadata)  # storage only among the folder's own listed files
        if failure:
            raise CheckpointError(failure)
        self._metadata = metadata

    def read_metadata(self):
        if getattr(self, "_metadata", None) is None:
            self.check_metadata()
        metadata = self._metadata
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but byte items (we save none) load with weights_only=True rather than as pickles."""

    def load_bytes(self, read_item, value):
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
