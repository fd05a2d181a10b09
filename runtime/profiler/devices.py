"""Which devices a profile's kernels run on: the GPU kind a profile records, and the devices the GEMM grid is
split across (runtime/profiler/build.py)."""
from __future__ import annotations

import torch

from planner.errors import PlanError


def recorded_gpu_kind(asked: str | None, measured: str, device_name: str) -> str:
    """The GPU kind the profile is labelled with: the measured device's, or --gpu-kind where it names the same
    device. A kind that does not match would let the planner price one GPU with another's numbers, and
    load_profile's other-GPU warning could not catch it. --gpu-kind may still name a device the planner does
    not know (neither kind in GPU_KINDS): a label for it, not a different GPU."""
    from planner.cluster import GPU_KINDS

    if asked is None or asked == measured:
        return measured
    if asked in GPU_KINDS or measured in GPU_KINDS:   # 'cpu' is a kind: a CPU profile is always 'cpu'
        raise PlanError(f"--gpu-kind {asked} does not match the device measured ({device_name}, GPU kind "
                        f"'{measured}'); leave --gpu-kind out to record '{measured}'")
    return asked


def gemm_devices(device: torch.device, world: int) -> list[str]:
    """Where the GEMM grid is timed: GPUs cuda:0..world-1 (one node's GPUs are identical, so each times a share
    of the grid), or `world` single-threaded processes on CPU (so the tests run the multi-process path)."""
    if device.type == "cuda":
        return [f"cuda:{r}" for r in range(world)]
    return ["cpu"] * world


def _split_how(n: int, cuda: bool) -> str:
    """How the GEMM grid was spread over `n` devices, in words for the gemm part's provenance."""
    if n == 1:
        return "timed on one GPU" if cuda else "timed in one process"
    where = f"{n} GPUs of the node" if cuda else f"{n} CPU processes"
    return f"grid split across {where} (shape i of the ordered grid on the (i mod {n})-th, in parallel)"
