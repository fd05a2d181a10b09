"""The results CSV that `plan validate` appends and `plan calibrate` reads: its columns, the recompute text of a
row, its sidecar of traced components, and the checks of a row's measured values."""
from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from planner.errors import PlanError

RESULT_COLUMNS = ["model", "gpus", "tp", "pp", "vpp", "dp", "cp", "ep", "micro_batch", "global_batch", "seq_len",
                  "recompute", "predicted_step_s", "measured_step_s", "predicted_mem_gib", "measured_mem_gib",
                  "gpu", "profile", "commit", "date"]
"""One row a run: what `plan validate --append` writes and `plan calibrate` reads."""

DIMS = ("tp", "dp", "pp", "cp", "ep")

_STAGE_RE = re.compile(r"^(\d+)(?:f(\d+))?(?:s(\d+))?$")


def recompute_text(stages) -> str:
    """Per-stage layers and recompute in one compact token: stages joined by '+', each '<layers>' then
    'f<n>' (fully recomputed layers) and 's<n>' (selectively recomputed) when non-zero.
    '12+12': two stages of 12, no recompute; '8f8+8s2': stage 0 all full, stage 1 two selective."""
    out = []
    for s in stages:
        t = str(s.layers)
        if s.full_recompute_layers:
            t += f"f{s.full_recompute_layers}"
        if s.selective_recompute_layers:
            t += f"s{s.selective_recompute_layers}"
        out.append(t)
    return "+".join(out)


def parse_recompute_text(text: str):
    from planner.plan import StagePlan

    stages = []
    for part in text.strip().split("+"):
        m = _STAGE_RE.match(part.strip())
        if not m:
            raise PlanError(f"recompute field '{text}' is not in the '<layers>[f<n>][s<n>]+...' form")
        stages.append(StagePlan(int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0)))
    return stages


def sidecar_path(results: Path) -> Path:
    return Path(results).with_suffix(".plans.jsonl")


def read_results(path: Path) -> list[dict]:
    """Data rows with their 1-based row number under '_row'; refuses a file with other columns."""
    from planner.json_input import InputError, check_regular_file
    try:
        check_regular_file(path, "results file")  # a FIFO or device would block or never end
    except InputError as exc:
        raise PlanError(str(exc)) from None
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames != RESULT_COLUMNS:
                raise PlanError(f"'{path}' does not have the results columns ({', '.join(RESULT_COLUMNS)})")
            rows = list(reader)
    except FileNotFoundError:
        raise PlanError(f"results file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PlanError(f"results file '{path}' is not a readable CSV ({exc.__class__.__name__})") from None
    for i, r in enumerate(rows, 1):
        r["_row"] = i
        check_measured_ranges(r, path)
    return rows


MEASURED_RANGES = {"measured_step_s": (0.0, 1e7, "seconds"), "measured_mem_gib": (0.0, 4096.0, "GiB")}
"""Column -> (low, high, unit) of what a run can measure (0 stands for not measured, as a blank does): a step of
more than about 116 days (planner.limits.MAX_SECONDS) or a GPU of more than 4 TiB is a typo or a forged row, not
a measurement."""


def check_measured_ranges(row: dict, path: Path) -> None:
    """A measured value present in `row` (blank means not measured) is a number inside MEASURED_RANGES; raises
    PlanError naming the row (1-based data-row number) and the column otherwise."""
    for column, (lo, hi, unit) in MEASURED_RANGES.items():
        text = (row.get(column) or "").strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise PlanError(f"row {row['_row']} of '{path}' has {column} '{text[:40]}', not a number") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise PlanError(f"row {row['_row']} of '{path}' has {column} {text[:40]}, outside the physical range "
                            f"{lo:g} to {hi:g} {unit}")


def read_sidecar(path: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    if not path.exists():
        return out
    from planner.json_input import InputError, parse, read_bytes
    try:
        text = read_bytes(path, "plans sidecar").decode("utf-8", "replace")
    except InputError as exc:
        raise PlanError(str(exc)) from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = parse(line, f"line {n} of '{path}'")
            out[int(d["row"])] = d["plan"]
        except (KeyError, TypeError, ValueError):  # json_input.InputError is a ValueError
            raise PlanError(f"line {n} of '{path}' is not a {{\"row\", \"plan\"}} record") from None
    return out


def _float(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
