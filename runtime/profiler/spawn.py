"""Measurements that need a process group: spawn `world` processes, run a function in each with the
default group up (NCCL on GPUs, gloo on CPU; NVLink multicast off), and return rank 0's JSON result.
Used by the host-time probe and the TP2 layer check; collectives.py keeps its own workers (they report
progress through a queue)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _entry(rank: int, world: int, cuda: bool, port: int, out_path: str, fn, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist

    from runtime.mesh import init_distributed

    init_distributed(cuda, timeout_min=5)
    try:
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        result = fn(world, device, *args)
        if rank == 0:
            Path(out_path).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_spawned(fn, world: int, cuda: bool, *args):
    """fn(world, device, *args) in every rank (a module-level function: spawn pickles it); rank 0's return."""
    import torch.multiprocessing as mp

    from runtime.profiler.collectives import _free_port, force_env

    force_env()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.start_processes(_entry, args=(world, cuda, _free_port(), out, fn, args), nprocs=world, join=True,
                           start_method="spawn")
        return json.loads(Path(out).read_text())
