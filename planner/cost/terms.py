"""Units, the overlap rule and the dataclasses the cost model's terms fill in."""
from __future__ import annotations

from dataclasses import dataclass



BF16 = 2
FP32 = 4

ADAMW_GRAD_SCALE = {"fp32": 1.0, "bf16": 28.0 / 30.0}
"""The profiled AdamW step (optimizer_s_per_param) reads an fp32 gradient: 30 B of traffic per parameter (master,
m, v read and written, 4 B each; gradient read, 4 B; bf16 weight written, 2 B). With bf16 gradients it reads 2 B
of gradient: 28 B, and a memory-bound kernel's time scales with its bytes (modelled, not profiled)."""


class cached_property:  # noqa: N801 - functools' version takes a lock per access on Python < 3.12
    def __init__(self, fn):
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def exposed_s(comm_s: float, beside_s: float, hidden_fraction: float, overlap: bool) -> float:
    """Communication left on the critical path when it runs beside `beside_s` of compute."""
    if not overlap:
        return comm_s
    return comm_s - min(hidden_fraction * comm_s, beside_s)


def two_chunk_exposed_s(transfer_s: float, experts_s: float) -> float:
    """What an MoE layer's all-to-alls add to its experts' time, one direction (forward or backward), with the
    tokens dispatched in two chunks (Layout.overlap_ep, runtime/parallel/expert.py): chunk 0's dispatch alone,
    chunk 1's beside chunk 0's experts, chunk 0's combine beside chunk 1's experts, chunk 1's combine alone.
    transfer_s: one chunk's all-to-all; experts_s: one chunk's experts. The transfers share one stream."""
    return 2 * transfer_s + 2 * max(experts_s, transfer_s) - 2 * experts_s


@dataclass(frozen=True)
class LayerCosts:
    """One transformer layer, one micro-batch, one rank; seconds."""

    fwd_compute_s: float
    bwd_compute_s: float
    fwd_comm_s: float
    """Exposed communication in forward (tp + cp + ep)."""
    bwd_comm_s: float
    selective_recompute_s: float
    """Extra backward time of a selectively recomputed layer."""
    comm_by_dim_s: dict
    """Exposed forward + backward communication per dimension, for the breakdown."""

    @property
    def fwd_s(self) -> float:
        return self.fwd_compute_s + self.fwd_comm_s

    @property
    def fwd_bwd_s(self) -> float:
        return self.fwd_s + self.bwd_compute_s + self.bwd_comm_s

    @property
    def full_recompute_s(self) -> float:
        return self.fwd_s


@dataclass(frozen=True)
class EndCosts:
    """Embedding (first stage) and output layer + loss (last stage), one micro-batch; seconds."""

    embedding_s: float
    head_s: float
    head_comm_s: float


@dataclass(frozen=True)
class MemoryTerms:
    base_bytes: float
    state_per_layer_bytes: float
    in_flight: list
    none_bytes: float
    sel_saving_bytes: float
    full_saving_bytes: float

    def bytes(self, counts, full, sel) -> float:
        total = self.base_bytes + (self.none_bytes if any(full) else 0.0)
        for k, n, f, s in zip(self.in_flight, counts, full, sel):
            total += (self.state_per_layer_bytes + k * self.none_bytes) * n - k * (self.full_saving_bytes * f + self.sel_saving_bytes * s)
        return total
