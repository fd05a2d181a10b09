"""Where profiles live and how one is chosen and loaded: the shipped ones, --profile paths and names, the GPU kind
of a device name, and the check that an output path can be written before any measuring."""
from __future__ import annotations

import re
import tempfile
import warnings
from importlib import resources
from pathlib import Path

from planner.errors import PlanError
from planner.profile.core import Profile


def check_output_file(path: Path, option: str, overwrite: bool = False, append: bool = False) -> None:
    """Refuses, in one sentence and before any measuring or fitting, an output path the command could not write
    at its end: a folder, an existing file (unless overwrite or append), or a folder it cannot create or write
    in (/proc, a file where a folder should be, no permission). Creates nothing: the writer makes a missing
    parent folder when it writes (as every command does)."""
    path = Path(path)
    if path.is_dir():
        raise PlanError(f"{option} '{path}' is a folder; give a file name")
    if path.exists() and not (overwrite or append):
        raise PlanError(f"'{path}' already exists; pass --force to overwrite it")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the folder that will hold the new ones
        folder = folder.parent
    if not folder.is_dir():
        raise PlanError(f"{option} '{path}' cannot be written: '{folder}' is not a folder")
    try:
        if path.exists():
            open(path, "a").close()  # opened for appending, nothing written: the file stays as it is
        else:
            tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-").close()
    except OSError as exc:
        raise PlanError(f"{option} '{path}' cannot be written ({exc.strerror or exc.__class__.__name__} "
                        f"in '{folder}')") from None


def shipped_profile_path(gpu: str) -> Path:
    return Path(str(resources.files("profiles"))) / f"{gpu}.json"


def default_profile_path(gpu: str) -> Path:
    """The profile the planner reads for `gpu` without --profile: the calibrated one where it ships (the
    measured profile with its overlap and efficiency factors refitted on measured runs by `plan calibrate`; on
    H200, 3.0% median, 13.2% worst step-time error on held-out GPU-paced runs against 10.1% / 28.3% for the
    measured one, benchmarks/results/calibration/), else the measured one."""
    calibrated = shipped_profile_path(f"{gpu}-calibrated")
    return calibrated if calibrated.exists() else shipped_profile_path(gpu)


def resolve_profile_path(path: str) -> Path:
    """`path`, or the shipped profile of that bare name (e.g. h200-sxm-calibrated) where no such file exists."""
    if not Path(path).exists() and shipped_profile_path(path).exists():
        return shipped_profile_path(path)
    return Path(path)


def profile_argument(profile: Profile) -> str:
    """How a command line names this profile: the bare name of a shipped one (resolve_profile_path reads it
    back), else its path."""
    path = Path(profile.source_path) if profile.source_path else None
    if path is None:
        return profile.gpu
    if path.parent == shipped_profile_path(profile.gpu).parent:
        return path.stem
    return str(path)


def gpu_kind_of_device(name: str) -> str:
    """The planner's GPU kind (planner.cluster.GPU_KINDS) for a device name as torch reports it ('NVIDIA H200'),
    'cpu' for the CPU; a GPU kind given already maps to itself. The profiler records this kind in a profile and
    `plan validate` the device name in its results, so `plan calibrate` can tell which rows a profile's GPU
    measured."""
    n = name.upper()
    if "H200" in n:
        return "h200-nvl" if "NVL" in n else "h200-sxm"
    if "H100" in n:
        if "PCIE" in n or "NVL" in n:
            return "h100-pcie" if "PCIE" in n else "h100-nvl"
        return "h100-96gb" if "96GB" in n else "h100-sxm"
    if "A100" in n and "80GB" in n:
        return "a100-80gb"
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "unknown-gpu"


def load_profile(path: str | None, gpu: str, other_gpu_ok: bool = False) -> Profile:
    """The profile at `path`, or the default for `gpu` (default_profile_path); one measured on another GPU is
    refused (PlanError), or only warned about with `other_gpu_ok` (--allow-other-gpu-profile)."""
    if path is None:
        p = default_profile_path(gpu)
        if not p.exists():
            raise PlanError(f"no profile ships for GPU '{gpu}'; run `plan profile` on one and pass --profile")
        prof = Profile.load(p)
    else:
        prof = Profile.load(resolve_profile_path(path))
    if prof.gpu != gpu and not other_gpu_ok:  # a shipped default is checked too: its file name proves nothing
        raise PlanError(f"profile '{path or p}' was measured on {prof.gpu}, but the plan is for {gpu}; measure "
                        f"one with `plan profile` on a {gpu}, or pass --allow-other-gpu-profile to price it with {prof.gpu}'s timings")
    if prof.gpu != gpu:
        warnings.warn(f"profile '{path or p}' was measured on {prof.gpu}, but the plan is for {gpu}", stacklevel=2)
    return prof
