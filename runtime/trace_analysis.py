"""What a torch.profiler trace of one step says about communication: how much of the NCCL kernels' time no
compute kernel ran beside them (exposed communication), from the GPU kernels' own start and end times.

Exposed time = the measure of (union of NCCL kernel intervals) minus (union of all other kernel intervals),
on this rank's GPU. A collective that waits for a slower peer counts as exposed: the step pays for it.
"""
from __future__ import annotations


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _measure(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _minus(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Measure of union(xs) minus union(ys); both already unions (sorted, disjoint)."""
    total, j = 0.0, 0
    for a, b in xs:
        covered = 0.0
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            covered += min(b, ys[k][1]) - max(a, ys[k][0])
            k += 1
        total += (b - a) - covered
    return total


def is_communication(name: str) -> bool:
    return "nccl" in name.lower()


def exposed_communication(kernels: list[tuple[str, float, float]]) -> dict:
    """kernels: (name, start, end) of every GPU kernel of the step, any time unit. Returns seconds if the
    unit is seconds: span (first start to last end), busy, communication, exposed communication."""
    comm = _union([(a, b) for n, a, b in kernels if is_communication(n)])
    comp = _union([(a, b) for n, a, b in kernels if not is_communication(n)])
    span = (max(b for _, _, b in kernels) - min(a for _, a, _ in kernels)) if kernels else 0.0
    return {"span": span, "busy": _measure(_union(comm + comp)), "compute": _measure(comp),
            "communication": _measure(comm), "exposed_communication": _minus(comm, comp)}


def kernels_of(prof) -> list[tuple[str, float, float]]:
    """(name, start_s, end_s) of the GPU kernels in a finished torch.profiler.profile."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((e.name, e.time_range.start / 1e6, e.time_range.end / 1e6))
    return out
