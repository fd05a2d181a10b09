"""Run a function in N gloo processes (CPU) and collect what rank 0 returns."""
from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, result_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = fn(rank, world, *args)
        if rank == 0:
            torch.save({"ok": out}, result_path)
    except Exception:
        if rank == 0 or not os.path.exists(result_path):
            torch.save({"error": traceback.format_exc()}, result_path + f".{rank}")
        raise
    finally:
        dist.destroy_process_group()
    # the work is done and its result written: leave without the interpreter's teardown, where a C++ thread
    # destructor now and then aborts a gloo worker ("terminate called without an active exception", about one
    # run in twenty of the TP2 FP8 test on 2026-11-30), which failed a test whose ranks had both finished
    os._exit(0)


NETWORK_FLAKES = ("DistNetworkError", "Connection reset by peer")
"""What a worker dies of when the local TCP rendezvous breaks under it, not the code under test: seen about once in
a few hundred multi-process tests on 2-core machines (locally and in a CI run, 2026-12-02: gloo's
new_group, while ranks built their subgroups). Such a run is tried once more, on a fresh port."""


def is_network_flake(failure_text: str) -> bool:
    """Whether a failed multi-process run died of NETWORK_FLAKES alone (no assertion of the test failed)."""
    return any(word in failure_text for word in NETWORK_FLAKES) and "AssertionError" not in failure_text


def run_workers(fn, world: int, *args, attempts: int = 2, fresh_dirs: tuple[str, ...] = ()):
    """fn(rank, world, *args) in `world` processes; returns rank 0's result. fn must be importable. A run that
    fails only with a NETWORK_FLAKES error is retried (up to `attempts` runs in all); any other failure is raised.
    fresh_dirs: folders the run writes into, emptied before a retry so that it starts as the first run did (a
    checkpoint the broken run saved would otherwise be refused as already there)."""
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            for folder in fresh_dirs:
                for entry in os.listdir(folder):
                    path = os.path.join(folder, entry)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "result.pt")
            try:
                mp.start_processes(_entry, args=(world, free_port(), fn, args, path), nprocs=world, join=True,
                                   start_method="spawn")
            except Exception as exc:
                errs = [torch.load(os.path.join(d, f), weights_only=False)["error"] for f in sorted(os.listdir(d))
                        if f.startswith("result.pt.")]
                if is_network_flake(str(exc) + "\n".join(errs)) and attempt < attempts:
                    print(f"run_workers: a worker lost its rendezvous connection ({NETWORK_FLAKES}); running again",
                          file=sys.stderr)
                    continue
                raise AssertionError("worker failed:\n" + "\n".join(errs)) from exc
            return torch.load(path, weights_only=False)["ok"]


def run_interpreted(fn, monkeypatch) -> list:
    """fn(rank, world) in one worker process under Triton's interpreter (TRITON_INTERPRET=1 must be set before
    Triton is imported, hence the fresh process): the runtime's Triton kernels run on CPU tensors. Skips the
    test where Triton is not installed. Returns fn's result (a list of problems, empty when all is well)."""
    import importlib.util

    import pytest
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return run_workers(fn, 1)
