"""The profile's format: its version, the efficiency terms and collectives it names, a collective's fitted line
(CollectiveFit) and the host's per-layer overheads (HostOverheads)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.collectives import collective_named, collective_names


PROFILE_FORMAT = "parallel-plan/profile"
PROFILE_VERSION = 1

EFFICIENCY_TERMS = ("compute", "expert", "tp", "cp", "ep", "pp", "dp", "optimizer", "host", "host_tp", "host_cp",
                    "ring")

COLLECTIVE_OPS = collective_names()
"""The built-in collectives' names (planner.collectives, read at import; a collective registered later is valid in
a profile too: validate.py asks the registry)."""


def bus_factor(op: str, n: int) -> float:
    """Bytes each rank moves over its link per byte of the collective's (full) buffer, nccl-tests' busbw
    convention: time = latency + size * factor / bus_bandwidth (planner.collectives); 0 for a group of one."""
    if n <= 1:
        return 0.0
    return collective_named(op).bus_factor(n)


@dataclass(frozen=True)
class CollectiveFit:
    op: str
    link: str
    group_size: int
    latency_s: float
    bus_bandwidth_bytes_per_s: float
    measured: bool
    """True when fitted to points measured at this group size; False when modelled from another."""
    points: tuple = ()
    """(bytes, seconds) pairs the fit came from; bytes = the full buffer (all-gather output, reduce-scatter input)."""
    fill_ratio: float = 0.0
    fill_s: float = 0.0
    """A modelled ring's pipeline fill (planner/profile/physics.py): below it a message runs at 1/(1 + fill_ratio) of
    the bus bandwidth, above it the fill costs fill_s; 0 for a plain line (measured fits)."""

    def time_s(self, size_bytes: float) -> float:
        """Between measured sizes: log-log interpolation of the measured points (NCCL switches protocol
        and algorithm with size, which one straight line misses); outside them: the fitted line."""
        if size_bytes <= 0 or self.group_size <= 1:
            return 0.0
        pts = self.points
        if self.measured and len(pts) >= 2 and pts[0][0] <= size_bytes <= pts[-1][0]:
            for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
                if b0 <= size_bytes <= b1:
                    if b1 == b0:
                        return t0
                    w = math.log(size_bytes / b0) / math.log(b1 / b0)
                    return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
        return self.overhead_s(size_bytes) + self.bandwidth_s(size_bytes)

    def bandwidth_s(self, size_bytes: float) -> float:
        """The line's bandwidth term: bytes x bus factor / bus bandwidth."""
        return size_bytes * bus_factor(self.op, self.group_size) / self.bus_bandwidth_bytes_per_s

    def overhead_s(self, size_bytes: float) -> float:
        """The line's latency plus the pipeline fill: min(fill_ratio x bandwidth term, fill_s)."""
        return self.latency_s + min(self.fill_ratio * self.bandwidth_s(size_bytes), self.fill_s)


FP8_GEMM_SPEEDUP = 2.0
"""Modelled: dense FP8 tensor-core peak over dense bf16 on H100 / H200 SXM (1,979 against 989 TFLOP/s, NVIDIA
datasheets). Used only for a profile without a measured FP8 table (gemm.fp8_points); a plan priced so says so
in its provenance."""

FP8_MODEL_NOTE = ("fp8 GEMMs: modelled as the measured bf16 GEMM at 2x its rate (H100/H200 datasheet FP8 vs bf16 "
                  "peak) plus the per-tensor scaling passes at copy bandwidth; not measured")

PROBE_EXPERTS = 8
"""Experts of the host probe's MoE layer (runtime/profiler/host.py)."""


@dataclass(frozen=True)
class HostOverheads:
    """Host (CPU) seconds the runtime spends issuing one layer's forward + backward for one micro-batch,
    measured by runtime/profiler/host.py. A virtual stage cannot run faster than its host time: the
    planner takes max(GPU time, host time) per stage and micro-batch. Zero where not measured."""

    layer_s: dict
    """recompute mode ('none', 'selective', 'full') -> seconds per layer and micro-batch (the base)."""
    tp_extra_s: dict
    """recompute mode -> seconds added by tensor parallelism (any degree > 1)."""
    cp_extra_s: float = 0.0
    """Seconds added per layer and micro-batch per extra context-parallel rank (x (cp - 1))."""
    fsdp_extra_s: float = 0.0
    """Added by fully sharded data parallelism (sharding 'full')."""
    expert_s: float = 0.0
    """The probe's MoE layer (PROBE_EXPERTS experts, EP1) minus its dense layer, divided by PROBE_EXPERTS.
    The runtime runs the local experts as grouped GEMMs (one kernel per projection however many experts),
    so the planner charges an MoE layer moe_layer_s() whatever its expert count."""
    ep_extra_s: float = 0.0
    """Added by expert parallelism (ep > 1)."""
    pp_chunk_s: float = 0.0
    """Per pipeline chunk (virtual stage) and micro-batch when pp > 1: sends, receives, schedule."""
    family_layer_s: dict = field(default_factory=dict)
    """family ('gpt', 'llama', 'bert') -> mode -> seconds: the base per family where measured."""
    ends_s: float = 0.0
    """Per micro-batch outside the layers (embedding, head, loss, per-step costs spread over micro-batches)."""
    family_ends_s: dict = field(default_factory=dict)
    family_single_rank_layer_s: dict = field(default_factory=dict)
    """family -> seconds per layer and micro-batch, recompute none, in one process without data parallelism.
    The base figures above come from DP2, whose gradient hooks and bucketed reductions cost host time a
    plan without a data-parallel group (dp * cp == 1) does not spend; for those plans layer_host_s takes
    off the difference (the same for every recompute mode: the hooks are per parameter). Empty in profiles measured
    without it, and when the probe ran on one GPU (its base is then single-rank already)."""
    family_single_rank_ends_s: dict = field(default_factory=dict)
    """family -> seconds per micro-batch outside the layers, in one process without data parallelism."""

    def micro_batch_ends_s(self, family: str = "", data_parallel: bool = True) -> float:
        if not data_parallel and family in self.family_single_rank_ends_s:
            return self.family_single_rank_ends_s[family]
        return self.family_ends_s.get(family, self.ends_s)

    def data_parallel_layer_s(self, family: str = "") -> float:
        """Host seconds per layer and micro-batch that data parallelism's gradient reduction adds: the DP2 base
        minus the single-rank figure; 0 where the single-rank figure was not measured. Not clipped at 0, so that
        a plan without data parallelism is priced at the single-rank figure itself, measured for exactly that
        case. Clipping would ignore a single-rank figure above the base, which a probe on another GPU or the
        probe's noise can give (an H200 probe has measured 3.3 ms against a base of 2.0 ms from another GPU)."""
        single = self.family_single_rank_layer_s.get(family or "llama")
        if single is None:
            return 0.0
        base = self.family_layer_s.get(family, self.layer_s).get("none", 0.0)
        return base - single

    def moe_layer_s(self) -> float:
        """Host time an MoE layer adds to a dense one (router, sort, dispatch, grouped expert GEMMs)."""
        return PROBE_EXPERTS * self.expert_s

    def layer_host_s(self, mode: str, tp: int, cp: int, sharding: str, moe: bool, ep: int,
                     family: str = "", tp_scale: float = 1.0, cp_scale: float = 1.0,
                     data_parallel: bool = True) -> float:
        """data_parallel: the plan has a gradient-reduction group (dp * cp > 1)."""
        t = self.family_layer_s.get(family, self.layer_s).get(mode, 0.0)
        if not data_parallel:
            t = max(t - self.data_parallel_layer_s(family), 0.0)
        if tp > 1:
            t += self.tp_extra_s.get(mode, 0.0) * tp_scale
        t += (cp - 1) * self.cp_extra_s * cp_scale
        if sharding == "full":
            t += self.fsdp_extra_s
        if moe:
            t += self.moe_layer_s()
        if ep > 1:
            t += self.ep_extra_s
        return t

    def recompute_order_violations(self) -> list[str]:
        """Families whose per-layer host time breaks none <= selective <= full. Recompute only adds work to a
        layer, so such a figure is the probe's noise (an H200 probe has measured llama selective 5.1 ms above full
        3.8 ms), and the planner will misjudge recompute in host-paced plans; worth a
        re-measurement."""
        out = []
        tables = dict(self.family_layer_s)
        if self.layer_s not in tables.values():  # the base is one family's figures (llama's) when measured so
            tables[""] = self.layer_s
        for family, t in sorted(tables.items()):
            vals = [t.get(m) for m in ("none", "selective", "full")]
            if None not in vals and not vals[0] <= vals[1] <= vals[2]:
                out.append(f"{family or 'base'}: none {vals[0] * 1e3:.2f} / selective {vals[1] * 1e3:.2f} / "
                           f"full {vals[2] * 1e3:.2f} ms")
        return out

    def to_dict(self) -> dict:
        return {"layer_s": dict(self.layer_s), "tp_extra_s": dict(self.tp_extra_s), "cp_extra_s": self.cp_extra_s,
                "fsdp_extra_s": self.fsdp_extra_s, "expert_s": self.expert_s, "ep_extra_s": self.ep_extra_s,
                "pp_chunk_s": self.pp_chunk_s,
                "family_layer_s": {f: dict(v) for f, v in self.family_layer_s.items()},
                "ends_s": self.ends_s, "family_ends_s": dict(self.family_ends_s),
                **({"family_single_rank_layer_s": dict(self.family_single_rank_layer_s),
                    "family_single_rank_ends_s": dict(self.family_single_rank_ends_s)}
                   if self.family_single_rank_layer_s else {})}

    @staticmethod
    def from_measurement(d: dict) -> "HostOverheads":
        return HostOverheads(layer_s={str(k): float(v) for k, v in d["layer_s"].items()},
                             tp_extra_s={str(k): float(v) for k, v in (d.get("tp_extra_s") or {}).items()},
                             family_layer_s={str(f): {str(k): float(v) for k, v in m.items()}
                                             for f, m in (d.get("family_layer_s") or {}).items()},
                             family_ends_s={str(f): float(v) for f, v in (d.get("family_ends_s") or {}).items()},
                             family_single_rank_layer_s={str(f): float(v) for f, v in
                                                         (d.get("family_single_rank_layer_s") or {}).items()},
                             family_single_rank_ends_s={str(f): float(v) for f, v in
                                                        (d.get("family_single_rank_ends_s") or {}).items()},
                             **{k: float(d.get(k, 0.0)) for k in ("cp_extra_s", "fsdp_extra_s", "expert_s",
                                                                  "ep_extra_s", "pp_chunk_s", "ends_s")})


ATTENTION_POINT_KEYS = ("seq", "head_dim", "causal", "fwd_tflops", "bwd_tflops", "batch", "heads", "fwd_s", "bwd_s",
                        "fwd_spread", "bwd_spread")
"""What a profile's attention points hold (the profiler keeps these of each kernels.time_attention result)."""
