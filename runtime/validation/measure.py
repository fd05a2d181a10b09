"""What `plan validate` measured: the steady state of a run's per-step CSV and the traced step the workers wrote
(--components-out)."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from runtime.trace_analysis import RankComponents


def _steady(rows: list[dict], warmup: int) -> dict:
    """The steady state of a run's per-step rows after the first `warmup`: the median step time and its range,
    the largest peak memory over ranks (None on CPU), the medians of optimizer time and bubble fraction, and the
    measured steps' wall-clock window (None without end_unix_s), which the GPUs' clock samples are matched to."""
    steady = rows[warmup:]

    def col(name):
        vals = []
        for r in steady:
            try:
                vals.append(float(r.get(name) or "nan"))
            except ValueError:
                pass
        return [v for v in vals if v == v]

    mem = col("peak_mem_max_gib") or col("peak_mem_gib")
    opt, bubble = col("optimizer_s"), col("bubble_frac")
    ends = col("end_unix_s")
    # the measured steps' wall-clock span: from the end of the last warm-up step (or the first measured step's
    # start, its end less its time) to the end of the last
    window = None
    if ends and len(ends) == len(steady):
        first_start = ends[0] - col("step_s")[0]
        try:
            first_start = float(rows[warmup - 1]["end_unix_s"]) if warmup > 0 else first_start
        except (KeyError, TypeError, ValueError):
            pass
        window = (first_start, ends[-1])
    return {"steps": len(steady), "step_s": statistics.median(col("step_s")), "window_unix_s": window,
            "step_s_min": min(col("step_s")), "step_s_max": max(col("step_s")),
            "mem_gib": max(mem) if mem else None,
            "mem_by_rank": steady[-1].get("peak_mem_by_rank", ""),
            "optimizer_s": statistics.median(opt) if opt else None,
            "bubble_frac": statistics.median(bubble) if bubble else None}


@dataclass(frozen=True)
class TracedStep:
    """The workers' --components-out record: one traced step, every rank's components."""
    step: int
    ranks: list[RankComponents]

    def compared_rank(self) -> RankComponents:
        """The rank with the largest span (then the most busy time): the one that sets the step's length."""
        return max(self.ranks, key=lambda r: (r.span_s, r.busy_s))

    def to_dict(self) -> dict:
        return {"step": self.step, "ranks": [r.to_dict() for r in self.ranks]}


def read_components(path: Path) -> TracedStep | str:
    """The traced step the workers wrote to `path`, or the sentence saying why there is none."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return "the run wrote no traced step"
    except (OSError, ValueError):
        return f"the traced step's file '{path.name}' could not be read"
    if not isinstance(data, dict):
        return f"the traced step's file '{path.name}' holds no record"
    if not data.get("traced"):
        return str(data.get("reason") or "not traced")
    try:
        ranks = [RankComponents.from_dict(d) for d in data["ranks"]]
        step = int(data["step"])
    except (KeyError, TypeError, ValueError):
        return f"the traced step's file '{path.name}' is malformed"
    return TracedStep(step, ranks) if ranks else "the traced step has no ranks"
