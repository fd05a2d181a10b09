"""Where a command may write: checked in one sentence before any work, so that nothing is half done, no
folder is made silently and nothing already there is overwritten without --force.

`check_output_file` for one file (`plan -o`, `plan export -o`, `plan profile --out`, `plan calibrate -o`),
`check_output_folder` for a folder of named files (`plan scaling -o DIR`). Neither creates anything but a
temporary probe file, removed at once (`probe_folder`, used by `plan launch` too).

An output never writes through a symbolic link it did not create: a link where an output goes is refused, and
with --force the link itself is removed (its target, dangling or not, is never opened), so that the write that
follows makes a file of its own in its place. `write_file` writes with O_NOFOLLOW and gives a new file its mode
at creation: no output ever changes the mode of a file that was there before."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from planner.errors import PlanError


def probe_folder(folder: Path, option: str, path: Path) -> None:
    """Refuses a folder this process cannot create a file in (no permission, /proc, a read-only disk), found by
    creating and removing a file there: os.access answers "writable" to root where a write would fail."""
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-").close()
    except OSError as exc:
        raise PlanError(f"{option} '{path}' cannot be written ({exc.strerror or exc.__class__.__name__} "
                        f"in '{folder}')") from None



def _replace_link(path: Path, option: str, overwrite: bool) -> None:
    """A symbolic link at `path`: refused, or with `overwrite` removed (the link, never its target)."""
    if not overwrite:
        raise PlanError(f"{option} '{path}' is a symbolic link; pass --force to replace the link itself "
                        "(its target is never written)")
    try:
        os.unlink(path)
    except OSError as exc:
        raise PlanError(f"{option} '{path}' is a symbolic link that cannot be removed "
                        f"({exc.strerror or exc.__class__.__name__})") from None


def write_file(path: Path, text: str, mode: int = 0o666) -> None:
    """Write `text` to `path` without following a symbolic link there (one planted after the checks is refused in
    one sentence); a new file is created with `mode` (less the umask), an existing one keeps its own."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        raise PlanError(f"'{path}' cannot be written ({exc.strerror or exc.__class__.__name__})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def check_output_file(path: Path, option: str, overwrite: bool = False) -> None:
    """`path` can be written as a new file (or, with `overwrite`, replace an existing file): its folder exists and
    takes files, and it is not a folder itself (not even with --force). A symbolic link there is refused, or with
    `overwrite` removed (see the module docstring)."""
    path = Path(path)
    if path.is_symlink():
        if not path.parent.is_dir():
            raise PlanError(f"{option} '{path}' cannot be written: its folder '{path.parent}' does not exist")
        probe_folder(path.parent, option, path)
        _replace_link(path, option, overwrite)
    if path.is_dir():
        raise PlanError(f"{option} '{path}' is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise PlanError(f"{option} '{path}' is not a regular file")
    if path.exists() and not overwrite:
        raise PlanError(f"'{path}' already exists; pass --force to overwrite it")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise PlanError(f"{option} '{path}' cannot be written: its folder '{folder}' {what} (create it first)")
    probe_folder(folder, option, path)
    if path.exists():
        try:
            open(path, "a").close()  # opened for appending, nothing written: the file stays as it is
        except OSError as exc:
            raise PlanError(f"{option} '{path}' cannot be written ({exc.strerror or exc.__class__.__name__})") from None


def check_output_folder(folder: Path, option: str, names: tuple[str, ...], overwrite: bool = False) -> None:
    """`folder` is a folder (or a new one whose parent exists) that takes files, and none of `names` in it exists
    unless `overwrite`: the first one that does is named."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise PlanError(f"{option} '{folder}' exists and is not a folder")
    if not folder.exists():
        parent = folder.parent
        if not parent.is_dir():
            raise PlanError(f"{option} '{folder}' cannot be created: '{parent}' "
                            f"{'is not a folder' if parent.exists() else 'does not exist'} (create it first)")
        probe_folder(parent, option, folder)
        return
    if not overwrite:
        for name in names:
            if (folder / name).exists() or (folder / name).is_symlink():
                raise PlanError(f"'{folder / name}' already exists; pass --force to overwrite it")
    for name in names:
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            raise PlanError(f"'{folder / name}' is a folder; {option} needs that name for a file")
    probe_folder(folder, option, folder)
    for name in names:  # only with overwrite: a link was refused above as an existing name
        if (folder / name).is_symlink():
            _replace_link(folder / name, option, overwrite)
