"""A checkpoint's manifest: what a save wrote, so that a resume reads nothing it did not write.

MANIFEST_FILE (JSON, never a pickle) is the last file a save puts in its step folder, written atomically (a
temporary file, fsync, os.replace, fsync of the folder): the sha256 and size of every other file in the folder,
the step, the hash of the plan that trained it and the source tree (git commit, else the package version).
`verify` checks a folder against it before torch.distributed.checkpoint reads a byte (DCP unpickles its
`.metadata`): a folder without a manifest, a file missing, changed, truncated or not listed, or an entry that is
not a regular file (a symbolic link, a FIFO) fails, with the reason in a few words. `load_metadata` then
unpickles DCP's `.metadata` through an unpickler that knows only the classes DCP's metadata is made of, so even
a verified folder cannot name a function to call, and `storage_outside` checks that every storage file the
metadata names is a bare file name the manifest lists, so that DCP opens no file outside the folder (another
step's, or any readable file on the machine).

A verified manifest means "written by a save of this program and unchanged since"; it is not a signature:
whoever can write the whole folder can write a matching manifest too (runtime/README.md, Checkpoints).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST_FILE = "manifest.json"
FORMAT = 1
_CHUNK_BYTES = 8 << 20
SMALL_FILE_BYTES = 16 << 20
"""Files up to this size are hashed even by the quick check (`verify(full=False)`): `.metadata`, training.json."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            h.update(chunk)  # hashlib releases the GIL on large buffers: files hash in parallel threads
    return h.hexdigest()


def _hash_all(paths: list[Path]) -> list[str]:
    workers = max(1, min(len(paths), os.cpu_count() or 1, 16))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(sha256_file, paths))


_source_tree: str | None = None


def source_tree() -> str:
    """The code that wrote a checkpoint: 'git <commit>' (PLAN_COMMIT or git), else 'parallel-plan <version>'."""
    global _source_tree
    if _source_tree is None:
        from planner.provenance import UNAVAILABLE, git_commit
        commit = git_commit()["git_commit"]
        if commit != UNAVAILABLE:
            _source_tree = f"git {commit}"
        else:
            from importlib.metadata import PackageNotFoundError, version
            try:
                _source_tree = f"parallel-plan {version('parallel-plan')}"
            except PackageNotFoundError:
                _source_tree = "unknown"
    return _source_tree


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_new(path: Path, text: str) -> None:
    """Create `path` with `text`, exclusively and without following a link (O_CREAT|O_EXCL|O_NOFOLLOW: anything
    already under that name, a planted link included, is an OSError), and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write(folder, step: int, plan_hash: str | None = None) -> Path:
    """Hash every file in `folder` (each fsynced first) and write the manifest, last and atomically."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_FILE
                   and not p.name.startswith(MANIFEST_FILE))
    for p in files:
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())
    digests = _hash_all(files)
    body = {"format": FORMAT, "step": step, "plan_sha256": plan_hash, "source_tree": source_tree(),
            "files": {p.name: {"bytes": p.stat().st_size, "sha256": d} for p, d in zip(files, digests)}}
    tmp = folder / (MANIFEST_FILE + ".tmp")
    if os.path.lexists(tmp):  # a temporary file of an earlier attempt: this folder is the save's own
        os.unlink(tmp)
    write_new(tmp, json.dumps(body, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST_FILE)
    _fsync_dir(folder)
    return folder / MANIFEST_FILE


def read(folder) -> dict:
    """The manifest's content; raises ValueError with the reason in a few words."""
    from planner.json_input import parse, read_bytes

    f = Path(folder) / MANIFEST_FILE
    if not f.is_file() or f.is_symlink():
        raise ValueError(f"it has no {MANIFEST_FILE}")
    try:
        body = parse(read_bytes(f, MANIFEST_FILE), MANIFEST_FILE)  # bounded: not yet trusted
        files = body["files"]
        ok = body.get("format") == FORMAT and isinstance(body.get("step"), int) and isinstance(files, dict) and all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
            for v in files.values())
    except (OSError, ValueError, TypeError, KeyError):  # json_input.InputError is a ValueError
        ok = False
    if not ok:
        raise ValueError(f"its {MANIFEST_FILE} is not a manifest this program wrote")
    return body


def verify(folder, full: bool = True) -> str | None:
    """None when `folder` matches its manifest, else why not ('file __0_0.distcp changed'). `full=False` checks
    sizes, and hashes only the small files (`.metadata` among them): quick enough for every rank to run."""
    folder = Path(folder)
    try:
        body = read(folder)
    except ValueError as exc:
        return str(exc)
    listed = body["files"]
    entries = [p for p in folder.iterdir() if p.name != MANIFEST_FILE]
    for p in sorted(entries):
        if not stat.S_ISREG(p.lstat().st_mode):
            return f"{p.name} is {'a symbolic link' if p.is_symlink() else 'not a regular file'}"
    present = {p.name for p in entries}
    for name in sorted(listed):
        if name not in present:
            return f"file {name} is missing"
    extra = sorted(present - set(listed))
    if extra:
        return f"file {extra[0]} is not in its manifest"
    for name, rec in sorted(listed.items()):
        size = (folder / name).stat().st_size
        if size != rec["bytes"]:
            return f"file {name} is {'truncated' if size < rec['bytes'] else 'longer than written'}"
    names = sorted(n for n, rec in listed.items() if full or rec["bytes"] <= SMALL_FILE_BYTES)
    for name, digest in zip(names, _hash_all([folder / n for n in names])):
        if digest != listed[name]["sha256"]:
            return f"file {name} changed"
    return None


def storage_outside(storage_data, listed: dict) -> str | None:
    """None when every storage file DCP's metadata names (`storage_data`: index -> _StorageInfo) is a bare file
    name the manifest lists (`listed`: name -> record), read within that file's size and with no transform; else
    why not, in a few words. Checked before DCP opens anything: a path with a folder in it, '..' or an absolute
    path would make DCP read a file this save did not write."""
    if not isinstance(storage_data, dict):
        return "its .metadata holds no storage index"
    for info in storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or "\0" in name \
                or name in (".", "..") or name in (MANIFEST_FILE, ".metadata") or name not in listed:
            return f"its .metadata names the storage file {name!r}, which is not a file of its own"
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(offset, int) and isinstance(length, int) and 0 <= offset
                and 0 <= length <= listed[name]["bytes"] - offset):
            return f"its .metadata reads past the end of {name}"
        if getattr(info, "transform_descriptors", None):
            return f"its .metadata asks for transforms of {name}, which no save of ours writes"
    return None


def verify_file(folder, name: str) -> str | None:
    """One listed file against the manifest (a rank re-checks `.metadata` right before DCP reads it)."""
    try:
        rec = read(folder)["files"].get(name)
    except ValueError as exc:
        return str(exc)
    if rec is None:
        return f"file {name} is not in its manifest"
    try:
        return None if sha256_file(Path(folder) / name) == rec["sha256"] else f"file {name} changed"
    except OSError:
        return f"file {name} is missing"


_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
      ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
      ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    """Knows DCP's metadata classes, torch dtypes and paths, nothing else: a pickle naming any other global
    (os.system, builtins.eval, ...) stops before it is called."""

    def find_class(self, module, name):
        import torch
        if (module, name) in _METADATA_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which checkpoint metadata never holds")


def load_metadata(data: bytes):
    """DCP's `.metadata` through the restricted unpickler; raises pickle.UnpicklingError (or ValueError etc.)."""
    return _MetadataUnpickler(io.BytesIO(data)).load()
