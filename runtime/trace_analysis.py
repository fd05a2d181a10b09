"""What a torch.profiler trace of one step says about communication: how much of the NCCL kernels' time no
compute kernel ran beside them (exposed communication), from the GPU kernels' own start and end times.

Exposed time = the measure of (union of NCCL kernel intervals) minus (union of all other kernel intervals),
on this rank's GPU. A collective that waits for a slower peer counts as exposed: the step pays for it.

`RankComponents` splits one rank's traced step into what `plan validate` compares with the cost model:
GPU compute (the union of non-NCCL kernels), exposed communication and GPU idle (span less busy: the
pipeline bubble, gaps while the host issues work, waits outside kernels). The three add up to the span.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields


def union_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of (start, end) intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def measure(intervals) -> float:
    """Total length of disjoint intervals."""
    return sum(b - a for a, b in intervals)


def uncovered(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
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
    comm = union_intervals([(a, b) for n, a, b in kernels if is_communication(n)])
    comp = union_intervals([(a, b) for n, a, b in kernels if not is_communication(n)])
    span = (max(b for _, _, b in kernels) - min(a for _, a, _ in kernels)) if kernels else 0.0
    return {"span": span, "busy": measure(union_intervals(comm + comp)), "compute": measure(comp),
            "communication": measure(comm), "exposed_communication": uncovered(comm, comp)}


def kernels_of(prof) -> list[tuple[str, float, float]]:
    """(name, start_s, end_s) of the GPU kernels in a finished torch.profiler.profile."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((e.name, e.time_range.start / 1e6, e.time_range.end / 1e6))
    return out


@dataclass(frozen=True)
class RankComponents:
    """One rank's GPU timeline of one traced step, in seconds."""
    rank: int
    span_s: float
    """First kernel start to last kernel end."""
    busy_s: float
    """Some kernel running (compute or communication)."""
    compute_s: float
    """Some non-NCCL kernel running."""
    communication_s: float
    """Some NCCL kernel running, hidden or not."""
    exposed_communication_s: float
    """Some NCCL kernel running and no compute kernel."""

    @property
    def idle_s(self) -> float:
        return max(0.0, self.span_s - self.busy_s)

    @classmethod
    def from_kernels(cls, rank: int, kernels: list[tuple[str, float, float]]) -> "RankComponents":
        """kernels: (name, start_s, end_s) of the step's GPU kernels on this rank (kernels_of)."""
        x = exposed_communication(kernels)
        return cls(rank=rank, span_s=x["span"], busy_s=x["busy"], compute_s=x["compute"],
                   communication_s=x["communication"], exposed_communication_s=x["exposed_communication"])

    def to_dict(self) -> dict:
        return {**asdict(self), "idle_s": self.idle_s}

    @classmethod
    def from_dict(cls, d: dict) -> "RankComponents":
        """The record to_dict wrote (idle_s, derived, is ignored); KeyError / TypeError / ValueError if malformed."""
        return cls(rank=int(d["rank"]), **{f.name: float(d[f.name]) for f in fields(cls) if f.name != "rank"})
