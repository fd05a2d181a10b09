"""Spawn `world` CPU processes with a gloo process group and run `fn(rank, world, *args)` in each.

Failures in any process fail the test with that process's traceback."""
from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from tests.runtime.dist_util import free_port, is_network_flake  # noqa: E402 (needs the repository root on sys.path)


def _entry(rank, world, port, fn, args, errq):
    for p in (_ROOT, os.path.dirname(os.path.abspath(__file__))):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # done and checked: leave without the interpreter's teardown, where a C++ thread destructor now and then
    # aborts a gloo worker (tests/runtime/dist_util.py says more)
    os._exit(0)


_CTX = None


def _context():
    """A forkserver that has imported torch once: each test process forks from it (a second or so)
    instead of importing torch afresh (several seconds per process on a 2-core runner)."""
    global _CTX
    if _CTX is None:
        import multiprocessing as std_mp
        _CTX = std_mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.functional"])
    return _CTX


def run(fn, world: int, *args, attempts: int = 2) -> None:
    """A run that fails only because its rendezvous connection broke (tests/runtime/dist_util.py,
    NETWORK_FLAKES) is tried again on a fresh port, up to `attempts` runs in all."""
    ctx = _context()
    for attempt in range(1, attempts + 1):
        errq = ctx.SimpleQueue()
        try:
            mp.start_processes(_entry, args=(world, free_port(), fn, args, errq), nprocs=world,
                               join=True, start_method="forkserver")
            return
        except Exception as exc:
            msgs = []
            while not errq.empty():
                r, tb = errq.get()
                msgs.append(f"--- rank {r} ---\n{tb}")
            if is_network_flake(str(exc) + "\n".join(msgs)) and attempt < attempts:
                print("_launch.run: a worker lost its rendezvous connection; running again", file=sys.stderr)
                continue
            raise AssertionError("distributed test failed:\n" + "\n".join(msgs or [str(exc)])) from None
