"""Where a command may write: checked in one sentence before any work, so that nothing is half done, no
folder is made silently and nothing already there is overwritten without --force.

`check_output_file` for one file (`plan -o`, `plan export -o`, `plan profile --out`, `plan calibrate -o`),
`check_output_folder` for a folder of named files (`plan scaling -o DIR`). Neither creates anything but a
temporary probe file, removed at once."""
from __future__ import annotations

import tempfile
from pathlib import Path

from planner.errors import PlanError


def _probe(folder: Path, option: str, path: Path) -> None:
    """Refuses a folder this process cannot create a file in (no permission, /proc, a read-only disk)."""
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-").close()
    except OSError as exc:
        raise PlanError(f"{option} '{path}' cannot be written ({exc.strerror or exc.__class__.__name__} "
                        f"in '{folder}')") from None


def check_output_file(path: Path, option: str, overwrite: bool = False) -> None:
    """`path` can be written as a new file (or, with `overwrite`, replace an existing file): its folder exists and
    takes files, and it is not a folder itself (not even with --force)."""
    path = Path(path)
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
    _probe(folder, option, path)
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
        _probe(parent, option, folder)
        return
    if not overwrite:
        for name in names:
            if (folder / name).exists():
                raise PlanError(f"'{folder / name}' already exists; pass --force to overwrite it")
    for name in names:
        if (folder / name).is_dir():
            raise PlanError(f"'{folder / name}' is a folder; {option} needs that name for a file")
    _probe(folder, option, folder)
