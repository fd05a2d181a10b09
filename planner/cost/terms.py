"""Units, the overlap rule and the dataclasses the cost model's terms fill in."""
from __future__ import annotations

from dataclasses import dataclass

from planner import memory as mem
from planner.memory.in_flight import chunk_maxima



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


def bucketed_exposed_s(comm_s: float, window_s: float, buckets: int, contention: float = 0.0) -> float:
    """Communication left on the critical path when it goes out in `buckets` equal buckets, one after another on
    one stream, each as soon as its share of a compute window of `window_s` is done (Megatron-Core's
    --overlap-grad-reduce: a bucket's reduce-scatter starts when backward has produced its last gradient) or, the
    mirror, each needed before its share of the window starts (--overlap-param-gather: a bucket's all-gather before
    the forward of its layers). With bucket k of n ready at k/n of the window, the last transfer ends at the latest of
    k/n x window + (n - k + 1)/n x comm over k, which is at k = n (only the last bucket's tail, comm / n, is left:
    communication keeps up) or at k = 1 (communication-bound: all of it less the n - 1 buckets' window it ran beside).
    The part that runs beside compute still costs `contention` of its time (the SMs and memory bandwidth the
    collectives take from the compute they overlap)."""
    if buckets <= 1 or window_s <= 0:
        return comm_s
    exposed = max(comm_s / buckets, comm_s - window_s * (1 - 1 / buckets))
    return exposed + contention * (comm_s - exposed)


def two_chunk_exposed_s(transfer_s: float, experts_s: float) -> float:
    """What an MoE layer's all-to-alls add to its experts' time, one direction (forward or backward), with the
    tokens dispatched in two chunks (Layout.overlap_ep, runtime/parallel/expert.py): chunk 0's dispatch alone,
    chunk 1's beside chunk 0's experts, chunk 0's combine beside chunk 1's experts, chunk 1's combine alone.
    transfer_s: one chunk's all-to-all; experts_s: one chunk's experts. The transfers share one stream."""
    return 2 * transfer_s + 2 * max(experts_s, transfer_s) - 2 * experts_s


def ep_beside_layer_exposed_s(a2a_s: float, dense_f_s: float, dense_b_s: float, experts_fb_s: float,
                              hidden_fraction: float) -> float:
    """What a MoE layer's four all-to-alls (`a2a_s` each: dispatch and combine, forward and backward) add to a
    micro-batch when the forward of one micro-batch runs beside the backward of another (Megatron-Core's EP A2A
    overlap, RuntimeTarget.ep_a2a_beside_layer): the backward's combine beside the forward's dense part (attention
    to router, `dense_f_s`), both dispatches beside the experts of both passes (`experts_fb_s`), the forward's
    combine beside the backward's dense part (`dense_b_s`); in each window at most `hidden_fraction` of the
    transfers hides (exposed_s)."""
    return (exposed_s(a2a_s, dense_f_s, hidden_fraction, True)
            + exposed_s(2 * a2a_s, experts_fb_s, hidden_fraction, True)
            + exposed_s(a2a_s, dense_b_s, hidden_fraction, True))


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
    """One rank's memory as a function of its chunks' layer counts n_c, fully f_c and selectively s_c recomputed:
    base + state * sum_c n_c + a_none if any f_c + the largest over the peak vectors h
    (PipelineSchedule.in_flight_peaks) of sum_c h_c (fixed_c + a_none n_c - d_full f_c - d_sel s_c): linear for each
    h, so CP-SAT takes one constraint per h."""
    base_bytes: float
    """Bytes no layer count moves and no moment of the schedule changes (states of the ends, workspaces, transient)."""
    state_per_layer_bytes: float
    peaks: tuple
    """The micro-batches each chunk holds at once at each moment that can be the rank's peak."""
    fixed_per_mb_bytes: list
    """Per chunk, bytes per micro-batch in flight that no layer count moves (hand-over, rotary table, head, embedding)."""
    none_bytes: float
    sel_saving_bytes: float
    full_saving_bytes: float

    @property
    def in_flight(self) -> list:
        """The most micro-batches each chunk holds at any moment (orders chunks in the greedy split)."""
        return list(chunk_maxima(self.peaks))

    def peak_base_bytes(self, h) -> float:
        """base_bytes and the fixed per-micro-batch bytes held at the moment of peak vector h."""
        return self.base_bytes + sum(k * w for k, w in zip(h, self.fixed_per_mb_bytes))

    def bytes(self, counts, full, sel) -> float:
        per_mb = [w + self.none_bytes * n - self.full_saving_bytes * f - self.sel_saving_bytes * s
                  for w, n, f, s in zip(self.fixed_per_mb_bytes, counts, full, sel)]
        return self.base_bytes + (self.none_bytes if any(full) else 0.0) + self.state_per_layer_bytes * sum(counts) \
            + mem.peak_in_flight_bytes(self.peaks, per_mb)
