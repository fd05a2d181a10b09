"""--components-out: one extra training step traced on the GPU, every rank's compute, exposed communication
and idle time written by rank 0 as JSON (`plan validate` compares them with the prediction)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from runtime.trace_analysis import RankComponents

NOT_TRACED_ON_CPU = "not traced on CPU (no GPU kernels to time)"
"""--components-out's marker on CPU, in place of the components."""


def _write_json(path: str, data: dict) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)  # a reader never sees half a file


def _traced_components(run_step) -> RankComponents:
    """This rank's GPU timeline of run_step(), one training step. Only the device is traced: host tracing slows
    a host-paced step about twenty-fold (runtime/trainer/step.py, _traced). The GPU is drained first, so the span
    holds this step alone."""
    from torch.profiler import ProfilerActivity, profile

    from runtime.trace_analysis import kernels_of

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_step()
        torch.cuda.synchronize()
    return RankComponents.from_kernels(dist.get_rank(), kernels_of(prof))


def write_step_components(path: str, cuda: bool, step: int, run_step) -> None:
    """--components-out: every rank traces run_step() (one extra training step), rank 0 gathers the ranks'
    components and writes them as JSON. On CPU nothing runs and rank 0 writes the NOT_TRACED_ON_CPU marker."""
    rank0 = dist.get_rank() == 0
    if not cuda:
        if rank0:
            _write_json(path, {"traced": False, "reason": NOT_TRACED_ON_CPU})
        return
    mine = _traced_components(run_step).to_dict()
    ranks = [mine]
    if dist.get_world_size() > 1:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    if rank0:
        _write_json(path, {"traced": True, "step": step, "ranks": ranks})
        print(f"traced step {step} (one extra step, not in the step CSV): components in {path}", flush=True)
