"""Rank 0's step CSV: its columns, opening it for appending, and setting aside a resumed run's rows logged after
its checkpoint."""
from __future__ import annotations

import csv
import os
from pathlib import Path

CSV_FIELDS = ["step", "loss", "grad_norm", "step_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_mem_gib",
              "data_wait_s", "lr", "peak_mem_max_gib", "peak_mem_by_rank", "optimizer_s", "bubble_frac", "end_unix_s"]
"""peak_mem_gib is rank 0's; peak_mem_max_gib the max over all ranks and peak_mem_by_rank every rank's
(';'-joined, global rank order), both CUDA only. optimizer_s: clip + AdamW of the slowest rank (CUDA events,
no extra synchronisation). bubble_frac: the pipeline's measured bubble (pp > 1, from its action timeline).
end_unix_s: wall clock when rank 0 saw the step finish (plan validate matches the GPUs' clock samples to it)."""


def open_results(path: Path):
    """Rank 0's step CSV, opened for appending: (file, csv.DictWriter). A new or empty file gets CSV_FIELDS as
    its header; a resumed run's file keeps its own header (one written before a column was added)."""
    new = not path.exists() or path.stat().st_size == 0
    fields = CSV_FIELDS
    if not new:
        with open(path, newline="") as fh:
            fields = next(csv.reader(fh), None) or CSV_FIELDS
    _end_with_newline(path)  # a row glued onto an unterminated last line would be lost
    results = open(path, "a", newline="")
    writer = csv.DictWriter(results, fieldnames=fields, extrasaction="ignore")
    if new:
        writer.writeheader()
    return results, writer


def _end_with_newline(path: Path) -> None:
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) not in (b"\n", b"\r"):
                fh.write(b"\n")


def set_aside_rows_after(path: Path, step: int) -> Path | None:
    """A resumed run continues its step CSV from `step`. Rows of later steps, logged by the interrupted run after
    its last checkpoint, would otherwise sit beside the resumed run's rows for the same steps: they move to
    <stem>.superseded-after-step-<step><suffix> (with the header), so nothing is lost or doubled. Returns that file."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header, body = rows[0], rows[1:]
    if "step" not in header:
        return None
    col = header.index("step")
    later = [r for r in body if _row_step(r, col) > step]
    if not later:
        return None
    aside = path.with_name(f"{path.stem}.superseded-after-step-{step}{path.suffix}")
    n = 2
    while aside.exists():
        aside = path.with_name(f"{path.stem}.superseded-after-step-{step}-{n}{path.suffix}")
        n += 1
    with open(aside, "w", newline="") as fh:
        csv.writer(fh).writerows([header] + later)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        csv.writer(fh).writerows([header] + [r for r in body if _row_step(r, col) <= step])
    tmp.replace(path)
    print(f"note: moved {len(later)} row(s) of steps after {step} from '{path}' (logged after the last "
          f"checkpoint) to '{aside}'", flush=True)
    return aside


def _row_step(row: list[str], col: int) -> int:
    """A row's step; a row without a readable one counts as step 0, so it stays where it is."""
    try:
        return int(row[col])
    except (IndexError, ValueError):
        return 0
