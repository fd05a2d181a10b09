"""`plan validate --append FILE`: the results CSV's row of one validated plan, appended with its plan (and the GPUs'
state and the traced step's components where there are some) in the sidecar `plan calibrate` reads."""
from __future__ import annotations

import csv
import datetime
import json
import os
from pathlib import Path

from planner.calibrate import RESULT_COLUMNS, recompute_text, sidecar_path
from planner.errors import PlanError
from planner.plan import Plan
from planner.provenance import commit_label
from runtime.validation.measure import TracedStep


def gpu_name(device: str) -> str:
    """The results CSV's `gpu` column: the name CUDA gives the first visible GPU, or 'cpu'."""
    if device != "cuda":
        return "cpu"
    import torch
    return torch.cuda.get_device_name(0)


def check_results_file(path: Path) -> int:
    """Data rows already in the results CSV (0 when it does not exist); refuses a file with other columns, a
    folder, or a place it could not be written (checked before the run, not after it)."""
    from planner.outputs import check_output_file

    check_output_file(path, "--append", overwrite=True)  # an existing file is appended to, never rewritten
    if not path.exists():
        return 0
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise PlanError(f"results file '{path}' exists but is empty; remove it or pick another --append file")
        if header != RESULT_COLUMNS:
            raise PlanError(f"results file '{path}' has other columns than a validation results CSV; "
                            "pick another --append file")
        return sum(1 for row in reader if row)


def result_row(plan: Plan, pred, meas: dict, gpu: str, profile_label: str) -> dict:
    """The results CSV's row (RESULT_COLUMNS) of one plan: its layout, the predicted and measured step time and
    peak memory, the GPU, the profile, the commit and the date."""
    lay = plan.layout
    return {"model": plan.model.name, "gpus": lay.world_size, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp,
            "dp": lay.dp, "cp": lay.cp, "ep": lay.ep, "micro_batch": lay.micro_batch,
            "global_batch": plan.training.global_batch, "seq_len": plan.training.seq_len,
            "recompute": recompute_text(plan.stages),
            "predicted_step_s": f"{pred.step_s:.6g}", "measured_step_s": f"{meas['step_s']:.6g}",
            "predicted_mem_gib": f"{max(pred.memory_gib_per_rank):.6g}",
            "measured_mem_gib": f"{meas['mem_gib']:.6g}" if meas["mem_gib"] is not None else "",
            "gpu": gpu, "profile": profile_label, "commit": commit_label(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def profile_label(profile_arg: str | None, gpu: str) -> str:
    """The results CSV's `profile` column: the --profile given, or 'shipped:<stem>' of the shipped file actually
    read (the calibrated one where it ships, e.g. shipped:h200-sxm-calibrated; planner.profile.load_profile)."""
    from planner.profile import default_profile_path, resolve_profile_path

    if profile_arg is None:
        return f"shipped:{default_profile_path(gpu).stem}"
    used = resolve_profile_path(profile_arg)
    return f"shipped:{used.stem}" if used != Path(profile_arg) else profile_arg


def append_row(path: Path, row: dict, plan: Plan, gpu_state: dict | None = None,
               components: TracedStep | None = None) -> int:
    """Append the row (header first when the file is new) and its plan to the sidecar, with the GPUs' clock and
    power during the measured steps where they were sampled (runtime/gpu_monitor.py) and the traced step's
    per-rank components where it was traced; returns the row number."""
    n = check_results_file(path) + 1
    new = not path.exists()
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        with open(path, "rb+") as fh:  # a last line without its newline: the row goes on a line of its own
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) not in (b"\n", b"\r"):
                fh.write(b"\n")
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=RESULT_COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)
    with open(sidecar_path(path), "a") as fh:
        rec = {"row": n, "plan": plan.to_dict()}
        if gpu_state:
            rec["gpu_state"] = gpu_state
        if components is not None:
            rec["components"] = components.to_dict()
        fh.write(json.dumps(rec) + "\n")
    return n
