"""Which code produced a result: the git commit of this tree, for every profile, result row and benchmark.

A copy of a committed tree run elsewhere (a GPU host that receives the working tree without its git metadata,
or with stale metadata) names its commit in the PLAN_COMMIT environment variable; that wins over git.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UNAVAILABLE = "unavailable (no commit or no git)"


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_commit(short: bool = False, dirty_paths: tuple[str, ...] = (), untracked: bool = False) -> dict:
    """{'git_commit', 'git_dirty'} (plus 'git_commit_source' when PLAN_COMMIT named it). git_dirty: files
    changed (tracked ones, and new ones if `untracked`; under `dirty_paths` if given), None when unknown."""
    if os.environ.get("PLAN_COMMIT"):
        return {"git_commit": os.environ["PLAN_COMMIT"], "git_dirty": None, "git_commit_source": "PLAN_COMMIT"}
    commit = _git("rev-parse", *(["--short"] if short else []), "HEAD")
    status = _git("status", "--porcelain", f"--untracked-files={'normal' if untracked else 'no'}",
                  *(["--", *dirty_paths] if dirty_paths else []))
    return {"git_commit": commit or UNAVAILABLE, "git_dirty": bool(status) if status is not None else None}


def commit_label(dirty_paths: tuple[str, ...] = (), mark_dirty: bool = False) -> str:
    """Short commit for a results row (git's 7-character abbreviation), with '+dirty' if asked and files (new ones included)
    changed under `dirty_paths`; 'unknown' without git."""
    c = git_commit(short=True, dirty_paths=dirty_paths, untracked=mark_dirty)
    if c["git_commit"] == UNAVAILABLE:
        return "unknown"
    return c["git_commit"] + ("+dirty" if mark_dirty and c["git_dirty"] else "")


def cpu_model() -> str | None:
    """The host CPU's model name from /proc/cpuinfo (Linux); None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
