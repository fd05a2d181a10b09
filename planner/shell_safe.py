"""What may reach a shell line: the strict patterns of names that exports write unquoted (Slurm's #SBATCH values,
a plan's model name) and the helpers that make any other text safe there (quoting, comment lines).

A plan is data from anywhere; `plan export` writes scripts that run with a job. So every value an export or a
printed command carries is either `shlex.quote`d or checked here against a pattern no shell reads specially, and
every comment line is stripped of line breaks and control characters (a newline in a comment would start a line
of its own)."""
from __future__ import annotations

import re
import shlex

from planner.errors import PlanError

MODEL_NAME_PATTERN = r"[A-Za-z0-9._/+-]{1,128}"
MODEL_NAME_RE = re.compile(MODEL_NAME_PATTERN)
MODEL_NAME_RULE = "1 to 128 letters, digits and . _ / + -"

SLURM_NAME_RE = re.compile(r"[A-Za-z0-9._+-]{1,128}")
SLURM_NAME_RULE = "1 to 128 letters, digits and . _ + -"
SLURM_LIST_RE = re.compile(r"[A-Za-z0-9._+-]{1,128}(,[A-Za-z0-9._+-]{1,128}){0,31}")
"""A partition may be a comma list (Slurm takes the first that can run the job)."""
SLURM_TIME_RE = re.compile(r"\d{1,6}(:\d{2}){0,2}|\d{1,4}-\d{1,2}(:\d{2}){0,2}")
"""Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
SLURM_TIME_RULE = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def check_model_name(name, where: str) -> str:
    """`name` if it is a model name an export may carry; else one sentence naming `where` it came from."""
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
        raise PlanError(f"{where} has the model name {name!r}, which is not {MODEL_NAME_RULE}")
    return name


def safe_model_name(text: str) -> str:
    """A model name from free text (a config's folder name): each run of other characters becomes '-'."""
    name = re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-")[:128]
    return name or "model"


def check_slurm_value(option: str, value: str, list_ok: bool = False) -> str:
    """A Slurm job name, account or partition (a comma list with `list_ok`) as #SBATCH may carry it unquoted."""
    pattern = SLURM_LIST_RE if list_ok else SLURM_NAME_RE
    if not pattern.fullmatch(value):
        raise PlanError(f"{option} {value!r} is not {SLURM_NAME_RULE}" + (" (or a comma list of such)" if list_ok else ""))
    return value


def check_slurm_time(value: str) -> str:
    if not SLURM_TIME_RE.fullmatch(value):
        raise PlanError(f"--time {value!r} is not a Slurm time limit ({SLURM_TIME_RULE})")
    return value


def comment(text: str) -> str:
    """One shell comment line of free text: line breaks and other control characters become spaces."""
    return "# " + "".join(c if c.isprintable() else " " for c in text)


def shell_line(argv: list[str]) -> str:
    """A command as one line a shell reads back as exactly `argv`."""
    return " ".join(shlex.quote(str(a)) for a in argv)
