"""The profile: measured kernel and collective times that the cost model reads (JSON, versioned).

`plan profile` (runtime/profiler) writes it; `Profile.load` validates it. The cost model asks it four
kinds of question, each answered from measured points:

- `gemm_s(m, n, k)`: a bf16 GEMM [m,k] x [k,n] with a bf16 output (forward and input-gradient GEMMs);
  achieved FLOP rate interpolated in log-shape space from measured shapes (along a measured line of the
  grid whose bracketing points are at most two octaves apart, else a plane fitted to the nearest points),
  capped by the roofline.
- `wgrad_s(m, n, k)`: the weight-gradient GEMM dY^T X as the runtime runs it, accumulating into an fp32
  main gradient (reads and writes m x n fp32 besides the bf16 operands), from its own measured points:
  with few tokens (k) it is far slower than a bf16-output GEMM of the same shape, so one table for both
  mispredicted either by up to 60% (session 4, benchmarks/results/README.md).
- `attention_s(...)`: flash/SDPA attention forward and backward; achieved rate interpolated over measured
  (sequence, head_dim, causal) points.
- `memory_bound_s(bytes)`: elementwise work at the measured device-copy bandwidth times an efficiency.
- `collective_s(op, bytes, group_size, link)`: latency + bytes x algorithm factor / bus bandwidth,
  fitted per op, link kind ('nvlink' inside a node, 'network' across nodes) and group size.

Each section records whether it is measured or modelled, and from what; plans copy that into their
provenance.
"""
from __future__ import annotations

import json
import math
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from planner.errors import PlanError, read_json

PROFILE_FORMAT = "parallel-plan/profile"
PROFILE_VERSION = 1

EFFICIENCY_TERMS = ("compute", "expert", "tp", "cp", "ep", "pp", "dp", "optimizer", "host", "host_tp", "host_cp",
                    "ring")

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(op: str, n: int) -> float:
    """Bytes each rank moves over its link per byte of the collective's (full) buffer, nccl-tests' busbw
    convention: time = latency + size * factor / bus_bandwidth."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise PlanError(f"unknown collective '{op}'")


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
        return self.latency_s + size_bytes * bus_factor(self.op, self.group_size) / self.bus_bandwidth_bytes_per_s


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
    off the difference (the same for every recompute mode: the hooks are per parameter). Empty in profiles
    measured before session 5, and when the probe ran on one GPU (its base is then single-rank already)."""
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
        case. (Clipped, a single-rank figure above the base, from another machine's probe or from the probe's
        noise, was ignored: r2 of session 15 measured 3.3 ms against a base of 2.0 ms from another machine.)"""
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
        layer, so such a figure is the probe's noise (session 4's llama: selective 5.1 ms above full 3.8 ms),
        and the planner will misjudge recompute in host-paced plans; worth a re-measurement."""
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


@dataclass
class Profile:
    gpu: str
    provenance: dict
    gemm_points: list[tuple[int, int, int, float]]
    """(m, n, k, seconds) for bf16 [m,k] x [k,n] with a bf16 output (forward and input-gradient layouts)."""
    attention_points: list[dict]
    """{'seq', 'head_dim', 'causal', 'fwd_tflops', 'bwd_tflops'}: achieved rates counting causal work halved."""
    copy_bandwidth_bytes_per_s: float
    elementwise_efficiency: float
    """Fraction of the copy bandwidth that norms / activations / residual adds reach."""
    optimizer_s_per_param: float
    """Fused AdamW step over fp32 master weights, per parameter (one device)."""
    collectives: list[CollectiveFit]
    overlap_hidden_fraction: dict[str, float]
    """Per dimension ('tp', 'dp', 'pp', 'cp', 'ep'): fraction of the communication that an overlapped
    implementation hides behind the compute beside it (at most that compute's time)."""
    kernel_launch_s: float = 5e-6
    efficiency: dict = field(default_factory=dict)
    """Calibrated multipliers (`plan calibrate`) on the cost model's terms, 1.0 when absent: 'compute'
    (dense layer and end kernels), 'expert' (MoE expert compute), 'tp', 'cp', 'ep', 'pp', 'dp'
    (communication of that dimension), 'optimizer', 'host' (the measured host time per layer, which a narrow
    probe model may over- or under-state), 'host_tp' and 'host_cp' (the host time tensor and context
    parallelism add, the least repeatable host figures) and 'ring' (attention under context parallelism: ring blocks and
    log-sum-exp merges against one kernel of the same work). They absorb what the runtime spends beyond its
    measured kernels (host time, contention); the measured kernel and collective times stay untouched."""
    source_path: str = ""
    extras: dict = field(default_factory=dict)
    host: HostOverheads | None = None
    """Measured host time per layer (runtime/profiler/host.py); None: no host floor (older profiles)."""
    wgrad_points: list[tuple[int, int, int, float]] = field(default_factory=list)
    """(m, n, k, seconds) of weight-gradient GEMMs [m,k] x [k,n] accumulated into fp32 (k = tokens); empty in
    profiles measured before session 4, where wgrad_s falls back to gemm_s."""
    fp8_points: list[tuple[int, int, int, float]] = field(default_factory=list)
    """(m, n, k, seconds) of FP8 GEMMs as runtime/parallel/fp8.py runs them (per-tensor scaling of both bf16
    operands included), forward and input-gradient layouts; empty before session 5 and on devices without FP8,
    where fp8_gemm_s is modelled."""

    # -- queries -------------------------------------------------------------
    def eff(self, term: str) -> float:
        return self.efficiency.get(term, 1.0)

    @property
    def peak_gemm_flops(self) -> float:
        return max(2.0 * m * n * k / t for m, n, k, t in self.gemm_points)

    def gemm_s(self, m: int, n: int, k: int) -> float:
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        return _gemm_s_cached(self._gemm_key(), m, n, k)

    @property
    def fp8_measured(self) -> bool:
        """Whether the profiler timed FP8 GEMMs (else fp8_gemm_s is modelled)."""
        return bool(self.fp8_points)

    def fp8_gemm_s(self, m: int, n: int, k: int) -> float:
        """An FP8 GEMM as runtime/parallel/fp8.py runs it: from the measured FP8 table where the profile has one;
        else modelled (FP8_MODEL_NOTE): the measured bf16 GEMM at
        FP8_GEMM_SPEEDUP times its rate, never faster than moving its 1-byte operands and 2-byte output once,
        plus the per-tensor scaling of both operands (absolute maximum, then one fused scale-clamp-cast pass:
        2 + 2 + 1 bytes per element of the bf16 operands at copy bandwidth, two kernels each)."""
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        if self.fp8_points:
            return _gemm_s_cached(self._gemm_key("fp8"), m, n, k)
        bf16 = self.gemm_s(m, n, k) - 5e-6
        t_mem = (m * k + k * n + 2 * m * n) / self.copy_bandwidth_bytes_per_s
        scaling = 5.0 * (m * k + n * k) / self.copy_bandwidth_bytes_per_s + 4 * self.kernel_launch_s
        return max(bf16 / FP8_GEMM_SPEEDUP, t_mem) + scaling + 5e-6

    @property
    def kernels_timed_at_power_cap(self) -> bool:
        """Whether the profiler timed this profile's kernels with the GPU held at its power cap
        (runtime/profiler/timing.py; profiles from before session 13 were timed in short bursts). Kernels timed
        to compare with it, or to add to it, are timed the same way."""
        return any(part.get("part") == "kernel_timing" and part.get("at_power_cap")
                   for part in self.provenance.get("parts", []))

    def gemm_table_s(self, table: str, m: int, n: int, k: int) -> float:
        """A GEMM from the named table: 'mm' (gemm_s), 'wgrad' (wgrad_s) or 'fp8' (fp8_gemm_s)."""
        return getattr(self, _TABLE_LOOKUP[table])(m, n, k)

    def gemm_measured(self, table: str, m: int, n: int, k: int) -> bool:
        """Whether gemm_table_s(table, m, n, k) reads a measured point of this profile rather than interpolating
        between points or modelling (an FP8 GEMM without an FP8 table); wgrad falls back to the 'mm' table as
        wgrad_s does."""
        if table == "wgrad" and not self.wgrad_points:
            table = "mm"
        pts = {"mm": self.gemm_points, "wgrad": self.wgrad_points, "fp8": self.fp8_points}[table]
        return bool(pts) and (m, n, k) in self._gemm_key(table).exact

    def wgrad_s(self, m: int, n: int, k: int) -> float:
        if not self.wgrad_points:
            return self.gemm_s(m, n, k)
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        return _gemm_s_cached(self._gemm_key("wgrad"), m, n, k)

    def _gemm_key(self, kind: str = "mm"):
        key = self.__dict__.get(f"_gk_{kind}")
        if key is None:
            pts = {"wgrad": self.wgrad_points, "fp8": self.fp8_points}.get(kind, self.gemm_points)
            key = self.__dict__[f"_gk_{kind}"] = _GemmTable(tuple(pts), self.copy_bandwidth_bytes_per_s)
        return key

    def attention_s(self, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, causal: bool,
                    backward: bool) -> float:
        """Flash attention for `batch` x `heads` over seq_q queries and seq_kv keys; causal halves the work
        when seq_q == seq_kv (the diagonal block of a ring step or a plain causal layer). A head dimension the
        profile has not measured runs as the next larger one measured (attention_kernel_head_dim)."""
        head_dim = self.attention_kernel_head_dim(head_dim, causal)
        flops = 4.0 * batch * heads * seq_q * seq_kv * head_dim
        if causal:
            flops /= 2
        if backward:
            flops *= 2.5
        rate = self._attention_rate(max(seq_q, seq_kv), head_dim, causal, backward)
        return flops / rate + self.kernel_launch_s

    def attention_measured(self, head_dim: int, causal: bool) -> bool:
        """Whether attention at this head dimension and mask has measured points (else attention_s reads the
        nearest measured head dimension's rate)."""
        return any(p["head_dim"] == head_dim and p["causal"] == causal for p in self.attention_points)

    def attention_kernel_head_dim(self, head_dim: int, causal: bool) -> int:
        """The head dimension whose measured kernel this one is priced as: itself where measured; else the next
        larger one measured, since the kernels pad the head dimension to their tile (on H200, head dimensions 80,
        96 and 112 ran in the time of 128 within 2%, forward and backward, and 160 in that of 192: session 16,
        benchmarks/attention_head_dims.py); above the largest measured, itself (at the nearest one's rate)."""
        dims = {p["head_dim"] for p in self.attention_points if p["causal"] == causal} \
            or {p["head_dim"] for p in self.attention_points}
        if head_dim in dims:
            return head_dim
        return min((d for d in dims if d > head_dim), default=head_dim)

    def _attention_rate(self, seq: int, head_dim: int, causal: bool, backward: bool) -> float:
        """Achieved rate at this sequence length: linear in log2(seq) between the two nearest measured
        lengths of the nearest head_dim (clamped at the ends of the grid)."""
        key = "bwd_tflops" if backward else "fwd_tflops"
        pts = [p for p in self.attention_points if p["causal"] == causal] or self.attention_points
        hd = min({p["head_dim"] for p in pts}, key=lambda d: abs(math.log2(d / head_dim)))
        by_seq = sorted((p["seq"], p[key]) for p in pts if p["head_dim"] == hd)
        x = math.log2(seq)
        lo = [sp for sp in by_seq if sp[0] <= seq]
        hi = [sp for sp in by_seq if sp[0] >= seq]
        if not lo:
            s0, r0 = by_seq[0]
            # below the grid: short sequences fill tiles poorly, scale down linearly (modelled)
            return r0 * 1e12 * max(seq / s0, 0.25)
        if not hi:
            return by_seq[-1][1] * 1e12
        (s0, r0), (s1, r1) = lo[-1], hi[0]
        if s0 == s1:
            return r0 * 1e12
        w = (x - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
        return (r0 + w * (r1 - r0)) * 1e12

    def kernel_s(self, name: str, nbytes: float, fallback: str | None = None) -> float:
        """A memory-bound kernel of the runtime measured by name (extras.elementwise / embedding_and_loss:
        layernorm_fwd, rmsnorm_bwd, gelu_fwd, swiglu_bwd, rotary_fwd, residual_add, embedding_fwd, ...),
        scaled linearly from its measured bytes; else the kernel `fallback` (a profile measured before the
        runtime had `name`, e.g. bias_gelu_fwd, then gelu_fwd); else the generic elementwise bandwidth."""
        if nbytes <= 0:
            return 0.0
        rates = self.__dict__.get("_kernel_rates")
        if rates is None:
            rates = {}
            for section in ("elementwise", "embedding_and_loss"):
                kernels = self.extras.get(section, {})
                kernels = kernels.get("kernels", kernels) if isinstance(kernels, dict) else {}
                for k, v in kernels.items():
                    if isinstance(v, dict) and v.get("seconds", 0) > 0 and v.get("bytes", 0) > 0:
                        rates[k] = v["bytes"] / v["seconds"]
            self.__dict__["_kernel_rates"] = rates
        rate = rates.get(name, rates.get(fallback) if fallback else None)
        if rate is None:
            return self.memory_bound_s(nbytes)
        return nbytes / rate + self.kernel_launch_s

    def memory_bound_s(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.copy_bandwidth_bytes_per_s * self.elementwise_efficiency) + self.kernel_launch_s

    def collective(self, op: str, group_size: int, link: str) -> CollectiveFit:
        return _collective_lookup(id(self), tuple(self.collectives), op, group_size, link)

    def collective_s(self, op: str, size_bytes: float, group_size: int, link: str) -> float:
        if group_size <= 1 or size_bytes <= 0:
            return 0.0
        return self.collective(op, group_size, link).time_s(size_bytes)

    # -- persistence -----------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": PROFILE_FORMAT, "version": PROFILE_VERSION, "gpu": self.gpu, "provenance": self.provenance,
            "gemm": {"points": [list(p) for p in self.gemm_points],
                     **({"wgrad_points": [list(p) for p in self.wgrad_points]} if self.wgrad_points else {}),
                     **({"fp8_points": [list(p) for p in self.fp8_points]} if self.fp8_points else {})},
            "attention": {"points": self.attention_points},
            "copy_bandwidth_bytes_per_s": self.copy_bandwidth_bytes_per_s,
            "elementwise_efficiency": self.elementwise_efficiency,
            "optimizer_s_per_param": self.optimizer_s_per_param,
            "kernel_launch_s": self.kernel_launch_s,
            "collectives": [{"op": c.op, "link": c.link, "group_size": c.group_size, "latency_s": c.latency_s,
                             "bus_bandwidth_bytes_per_s": c.bus_bandwidth_bytes_per_s, "measured": c.measured,
                             "points": [list(p) for p in c.points]} for c in self.collectives],
            "overlap_hidden_fraction": self.overlap_hidden_fraction,
            "efficiency": self.efficiency,
            "extras": self.extras,
            **({"host": self.host.to_dict()} if self.host is not None else {}),
        }

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @staticmethod
    def from_dict(d: dict, source: str = "") -> "Profile":
        where = f"profile '{source}'" if source else "profile"
        if not isinstance(d, dict) or d.get("format") != PROFILE_FORMAT:
            raise PlanError(f"{where} is not a parallel-plan profile (its 'format' field is missing or foreign)")
        if d.get("version") != PROFILE_VERSION:
            raise PlanError(f"{where} has version {d.get('version')!r}; this build reads version {PROFILE_VERSION}")
        try:
            gemm = d["gemm"]
            prof = Profile(
                gpu=str(d["gpu"]), provenance=dict(d["provenance"]),
                gemm_points=_gemm_points(gemm["points"]),
                attention_points=[dict(seq=_whole(p["seq"]), head_dim=_whole(p["head_dim"]), causal=bool(p["causal"]),
                                       fwd_tflops=_number(p["fwd_tflops"]), bwd_tflops=_number(p["bwd_tflops"]))
                                  for p in d["attention"]["points"]],
                copy_bandwidth_bytes_per_s=_number(d["copy_bandwidth_bytes_per_s"]),
                elementwise_efficiency=_number(d["elementwise_efficiency"]),
                optimizer_s_per_param=_number(d["optimizer_s_per_param"]),
                kernel_launch_s=_number(d.get("kernel_launch_s", 5e-6)),
                collectives=[CollectiveFit(op=str(c["op"]), link=str(c["link"]), group_size=_whole(c["group_size"]),
                                           latency_s=_number(c["latency_s"]),
                                           bus_bandwidth_bytes_per_s=_number(c["bus_bandwidth_bytes_per_s"]),
                                           measured=bool(c["measured"]),
                                           points=_collective_points(c.get("points", ())))
                             for c in d["collectives"]],
                overlap_hidden_fraction={str(k): _number(v) for k, v in d["overlap_hidden_fraction"].items()},
                efficiency={str(k): _number(v) for k, v in (d.get("efficiency") or {}).items()},
                source_path=source, extras=dict(d.get("extras") or {}),
                host=HostOverheads.from_measurement(d["host"]) if d.get("host") is not None else None,
                wgrad_points=_gemm_points(gemm.get("wgrad_points", [])),
                fp8_points=_gemm_points(gemm.get("fp8_points", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"{where} is corrupted ({exc.__class__.__name__}: {exc})") from None
        _validate(prof, where)
        return prof

    @staticmethod
    def load(path: Path) -> "Profile":
        d = read_json(path, "profile")
        return Profile.from_dict(d, str(path))


def _number(v):
    """A measured number as a float; a value that is not one is kept as it is, for _validate to name."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def _whole(v):
    """A size (GEMM dimension, sequence, head_dim, group size) as an int; anything but a whole finite number is
    kept as it is, for _validate to name (int() would truncate 1.5 and raise on NaN)."""
    f = _number(v)
    if isinstance(f, float) and math.isfinite(f) and f == int(f):
        return int(f)
    return v


def _gemm_points(points) -> list[tuple]:
    return [(_whole(m), _whole(n), _whole(k), _number(t)) for m, n, k, t in points]


def _collective_points(points) -> tuple:
    pts = [(_number(p[0]), _number(p[1])) for p in points]
    return tuple(sorted(pts, key=lambda p: p[0] if isinstance(p[0], float) else -math.inf))


def _is_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _Checker:
    """Range checks of a profile's numbers: the first bad one raises one sentence naming the file and the field."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, field_name: str, value, want: str):
        raise PlanError(f"{self.where} is corrupted: {field_name} is {value!r}, not {want}")

    def positive(self, field_name: str, v) -> None:
        if not (_is_finite(v) and v > 0):
            self.fail(field_name, v, "a finite number above 0")

    def non_negative(self, field_name: str, v) -> None:
        if not (_is_finite(v) and v >= 0):
            self.fail(field_name, v, "a finite number >= 0")

    def within(self, field_name: str, v, lo: float, hi: float, want: str) -> None:
        if not (_is_finite(v) and lo <= v <= hi):
            self.fail(field_name, v, want)

    def size(self, field_name: str, v) -> None:
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            self.fail(field_name, v, "a whole number >= 1")


def _validate(p: Profile, where: str) -> None:
    """Every number the cost model reads, checked on load: a NaN or a zero size would otherwise come out as a
    'nan s' step time, an absurd one, or a traceback deep in the cost model."""
    check = _Checker(where)
    _check_gemms(p, check)
    _check_attention(p, check)
    check.positive("copy_bandwidth_bytes_per_s", p.copy_bandwidth_bytes_per_s)
    if not (_is_finite(p.elementwise_efficiency) and 0 < p.elementwise_efficiency <= 1):
        check.fail("elementwise_efficiency", p.elementwise_efficiency, "a fraction within (0, 1]")
    check.positive("optimizer_s_per_param", p.optimizer_s_per_param)
    check.non_negative("kernel_launch_s", p.kernel_launch_s)
    _check_collectives(p, check)
    _check_kernel_tables(p, check)
    if p.host is not None:
        _check_host(p.host, check)
    for k, v in p.efficiency.items():
        if k not in EFFICIENCY_TERMS:
            raise PlanError(f"{where} is corrupted: efficiency '{k}' is not a known term "
                            f"({', '.join(EFFICIENCY_TERMS)})")
        check.within(f"efficiency.{k}", v, 0.1, 50.0, "within [0.1, 50]")
    for k, v in p.overlap_hidden_fraction.items():
        check.within(f"overlap_hidden_fraction.{k}", v, 0.0, 1.0, "a fraction within [0, 1]")


def _check_gemms(p: Profile, check: _Checker) -> None:
    if not p.gemm_points:
        raise PlanError(f"{check.where} is corrupted: its GEMM table (gemm.points) is empty")
    for table, points in (("points", p.gemm_points), ("wgrad_points", p.wgrad_points), ("fp8_points", p.fp8_points)):
        for i, (m, n, k, t) in enumerate(points):
            for name, v in (("m", m), ("n", n), ("k", k)):
                check.size(f"gemm.{table}[{i}] {name}", v)
            check.positive(f"gemm.{table}[{i}] seconds", t)


def _check_attention(p: Profile, check: _Checker) -> None:
    if not p.attention_points:
        raise PlanError(f"{check.where} is corrupted: its attention table (attention.points) is empty")
    for i, a in enumerate(p.attention_points):
        check.size(f"attention.points[{i}].seq", a["seq"])
        check.size(f"attention.points[{i}].head_dim", a["head_dim"])
        check.positive(f"attention.points[{i}].fwd_tflops", a["fwd_tflops"])
        check.positive(f"attention.points[{i}].bwd_tflops", a["bwd_tflops"])


def _check_collectives(p: Profile, check: _Checker) -> None:
    for i, c in enumerate(p.collectives):
        name = f"collectives[{i}]"
        if c.op not in COLLECTIVE_OPS:
            raise PlanError(f"{check.where} is corrupted: {name}.op is '{c.op}', not one of "
                            f"{', '.join(COLLECTIVE_OPS)}")
        check.size(f"{name}.group_size", c.group_size)
        check.non_negative(f"{name}.latency_s", c.latency_s)
        check.positive(f"{name}.bus_bandwidth_bytes_per_s", c.bus_bandwidth_bytes_per_s)
        for j, (nbytes, t) in enumerate(c.points):
            check.positive(f"{name}.points[{j}] bytes", nbytes)
            check.positive(f"{name}.points[{j}] seconds", t)


def _check_kernel_tables(p: Profile, check: _Checker) -> None:
    """The named memory-bound kernels kernel_s reads (extras.elementwise, extras.embedding_and_loss)."""
    for section in ("elementwise", "embedding_and_loss"):
        kernels = p.extras.get(section, {})
        kernels = kernels.get("kernels", kernels) if isinstance(kernels, dict) else {}
        for name, v in kernels.items():
            if isinstance(v, dict) and ("seconds" in v or "bytes" in v):
                check.positive(f"extras.{section}.{name}.seconds", v.get("seconds"))
                check.positive(f"extras.{section}.{name}.bytes", v.get("bytes"))


def _check_host(h: HostOverheads, check: _Checker) -> None:
    fields = {**{f"layer_s.{k}": v for k, v in h.layer_s.items()},
              **{f"tp_extra_s.{k}": v for k, v in h.tp_extra_s.items()},
              **{f"family_layer_s.{f}.{k}": v for f, m in h.family_layer_s.items() for k, v in m.items()},
              **{f"family_ends_s.{k}": v for k, v in h.family_ends_s.items()},
              **{f"family_single_rank_layer_s.{k}": v for k, v in h.family_single_rank_layer_s.items()},
              **{f"family_single_rank_ends_s.{k}": v for k, v in h.family_single_rank_ends_s.items()},
              **{k: getattr(h, k) for k in ("cp_extra_s", "fsdp_extra_s", "expert_s", "ep_extra_s", "pp_chunk_s",
                                            "ends_s")}}
    for name, v in fields.items():
        if not (_is_finite(v) and 0 <= v < 1.0):
            check.fail(f"host.{name}", v, "a host overhead within [0, 1) s per layer")


LINE_MAX_BRACKET_OCTAVES = 2.0
"""A GEMM is interpolated along a measured line only where the line's points either side of it are at most this
many octaves apart (a factor of 4). Over a wider bracket the rate's curve is far from straight in log2: 512 x 3072 x
2304 read 42% slow between n = 768 and 16384 (benchmarks/results/session17-2026-12-02/gemm-lookup)."""

PLANE_NEAREST_POINTS = 20
"""How many measured shapes nearest in log2 shape the off-line fallback fits its plane to."""

PLANE_SLOPE_RIDGE = 1e-2
"""Ridge on the fitted plane's three slopes (weights normalised to at most 1): keeps the fit solvable when the
nearest points span fewer than three dimensions."""


class _GemmTable:
    """Measured GEMMs as arrays of log2 shapes and log achieved rates, for nearest-neighbour lookups."""

    def __init__(self, points: tuple, copy_bw: float):
        import numpy as np

        arr = np.array([(m, n, k, t) for m, n, k, t in points], dtype=float)
        self.log_shape = np.log2(arr[:, :3])
        self.log_rate = np.log(2.0 * arr[:, 0] * arr[:, 1] * arr[:, 2] / arr[:, 3])
        self.exact = {(int(m), int(n), int(k)): t for m, n, k, t in points}
        self.copy_bw = copy_bw
        # lines through the grid: the points sharing two dimensions, sorted along the third
        self.lines: dict = {}
        for (m, n, k), t in self.exact.items():
            rate = math.log(2.0 * m * n * k / t)
            for axis, (x, rest) in enumerate(((m, (n, k)), (n, (m, k)), (k, (m, n)))):
                self.lines.setdefault((axis, rest), []).append((math.log2(x), rate))
        for v in self.lines.values():
            v.sort()

    def along_line(self, m: int, n: int, k: int) -> float | None:
        """Log rate interpolated along a measured line (two dimensions equal to the query's), linear in
        log2 of the third; None when no line brackets the query within LINE_MAX_BRACKET_OCTAVES."""
        for axis, (x, rest) in enumerate(((m, (n, k)), (n, (m, k)), (k, (m, n)))):
            line = self.lines.get((axis, rest))
            if not line:
                continue
            lx = math.log2(x)
            lo = [p for p in line if p[0] <= lx]
            hi = [p for p in line if p[0] >= lx]
            if lo and hi:
                (x0, r0), (x1, r1) = lo[-1], hi[0]
                if x1 - x0 > LINE_MAX_BRACKET_OCTAVES:
                    continue
                return r0 if x1 == x0 else r0 + (lx - x0) / (x1 - x0) * (r1 - r0)
        return None

    def plane_log_rate(self, m: int, n: int, k: int) -> float:
        """Log rate at a shape on no usable line: a plane in log2 shape fitted by weighted least squares to the
        PLANE_NEAREST_POINTS nearest measured shapes (weights 1 / squared distance), clamped to the range of
        their rates so that it never extrapolates past them. It follows the rate's slope where inverse-distance
        weights over the 4 nearest averaged it away. With the two-octave line rule, over session 16's 8,335
        off-grid shapes the share missing by more than 15% went from 2.4% to 1.3%, the 99th percentile from 17.7%
        to 15.6%, the median from 3.1% to 2.9% (benchmarks/results/session17-2026-12-02/gemm-lookup)."""
        import numpy as np

        query = np.log2([m, n, k])
        dist2 = ((self.log_shape - query) ** 2).sum(axis=1)
        count = min(PLANE_NEAREST_POINTS, len(dist2))
        near = np.argpartition(dist2, count - 1)[:count]
        sqrt_weight = np.sqrt(1.0 / np.maximum(dist2[near], 1e-12))
        sqrt_weight /= sqrt_weight.max()
        offsets = self.log_shape[near] - query              # the plane's value at the query is its intercept
        design = np.c_[np.ones(count), offsets] * sqrt_weight[:, None]
        rates = self.log_rate[near]
        ridge = np.diag([0.0, PLANE_SLOPE_RIDGE, PLANE_SLOPE_RIDGE, PLANE_SLOPE_RIDGE])
        intercept = np.linalg.solve(design.T @ design + ridge, design.T @ (rates * sqrt_weight))[0]
        return float(min(max(intercept, rates.min()), rates.max()))


_TABLE_LOOKUP = {"mm": "gemm_s", "wgrad": "wgrad_s", "fp8": "fp8_gemm_s"}
"""GEMM table name -> the Profile method that answers from it (Profile.gemm_table_s)."""


@lru_cache(maxsize=200_000)
def _gemm_s_cached(table: _GemmTable, m: int, n: int, k: int) -> float:
    flops = 2.0 * m * n * k
    t_mem = 2.0 * (m * k + k * n + m * n) / table.copy_bw  # a GEMM cannot beat moving its operands once
    exact = table.exact.get((m, n, k))
    if exact is not None:
        return exact + 5e-6
    log_rate = table.along_line(m, n, k)
    if log_rate is None:
        log_rate = table.plane_log_rate(m, n, k)
    return max(flops / math.exp(log_rate), t_mem) + 5e-6


@lru_cache(maxsize=4096)
def _collective_lookup(pid: int, fits: tuple, op: str, group_size: int, link: str) -> CollectiveFit:
    exact = [c for c in fits if c.op == op and c.link == link and c.group_size == group_size]
    if exact:
        return exact[0]
    same = [c for c in fits if c.op == op and c.link == link]
    if not same:
        same = [c for c in fits if c.op == op]
    if not same:
        raise PlanError(f"the profile has no figure for {op} over {link}")
    # model another group size from the nearest measured one: same bus bandwidth (ring / NVSwitch: each GPU
    # drives its own links), latency growing with the ring's (n-1) steps
    base = min(same, key=lambda c: abs(math.log2(c.group_size / group_size)))
    steps = max(group_size - 1, 1) / max(base.group_size - 1, 1)
    return CollectiveFit(op=op, link=link, group_size=group_size, latency_s=base.latency_s * steps,
                         bus_bandwidth_bytes_per_s=base.bus_bandwidth_bytes_per_s, measured=False)


def fit_collective(points: list[tuple[float, float]], op: str, group_size: int, link: str,
                   measured: bool = True) -> CollectiveFit:
    """Least-squares fit of time = latency + bytes * factor / busbw, weighted by 1/time so that small and
    large messages count alike (relative error). Needs at least two sizes."""
    f = bus_factor(op, group_size)
    xs = [b * f for b, _ in points]
    ts = [t for _, t in points]
    # weighted least squares on t = a + c*x with weights 1/t^2
    w = [1.0 / (t * t) for t in ts]
    sw = sum(w); swx = sum(wi * x for wi, x in zip(w, xs)); swt = sum(wi * t for wi, t in zip(w, ts))
    swxx = sum(wi * x * x for wi, x in zip(w, xs)); swxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * swxx - swx * swx
    if det <= 0:
        raise PlanError(f"cannot fit {op}: need at least two distinct message sizes")
    c = (sw * swxt - swx * swt) / det
    a = (swt - c * swx) / sw
    a = max(a, 0.0)
    c = max(c, 1e-15)
    return CollectiveFit(op=op, link=link, group_size=group_size, latency_s=a, bus_bandwidth_bytes_per_s=1.0 / c,
                         measured=measured, points=tuple((float(b), float(t)) for b, t in points))


def check_output_file(path: Path, option: str, overwrite: bool = False, append: bool = False) -> None:
    """Refuses, in one sentence and before any measuring or fitting, an output path the command could not write
    at its end: a folder, an existing file (unless overwrite or append), or a folder it cannot create or write
    in (/proc, a file where a folder should be, no permission). Creates nothing: the writer makes a missing
    parent folder when it writes (the commands always have)."""
    path = Path(path)
    if path.is_dir():
        raise PlanError(f"{option} '{path}' is a folder; give a file name")
    if path.exists() and not (overwrite or append):
        raise PlanError(f"'{path}' already exists; pass --force to overwrite it")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the folder that will hold the new ones
        folder = folder.parent
    if not folder.is_dir():
        raise PlanError(f"{option} '{path}' cannot be written: '{folder}' is not a folder")
    try:
        if path.exists():
            open(path, "a").close()  # opened for appending, nothing written: the file stays as it is
        else:
            tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-").close()
    except OSError as exc:
        raise PlanError(f"{option} '{path}' cannot be written ({exc.strerror or exc.__class__.__name__} "
                        f"in '{folder}')") from None


def shipped_profile_path(gpu: str) -> Path:
    return Path(str(resources.files("profiles"))) / f"{gpu}.json"


def default_profile_path(gpu: str) -> Path:
    """The profile the planner reads for `gpu` without --profile: the calibrated one where it ships (the
    measured profile with its overlap and efficiency factors refitted on measured runs by `plan calibrate`;
    session 9: 3.0% median, 13.2% worst step-time error on held-out GPU-paced runs against 10.1% / 28.3% for the
    measured one, benchmarks/results/README.md), else the measured one."""
    calibrated = shipped_profile_path(f"{gpu}-calibrated")
    return calibrated if calibrated.exists() else shipped_profile_path(gpu)


def resolve_profile_path(path: str) -> Path:
    """`path`, or the shipped profile of that bare name (e.g. h200-sxm-calibrated) where no such file exists."""
    if not Path(path).exists() and shipped_profile_path(path).exists():
        return shipped_profile_path(path)
    return Path(path)


def profile_argument(profile: Profile) -> str:
    """How a command line names this profile: the bare name of a shipped one (resolve_profile_path reads it
    back), else its path."""
    path = Path(profile.source_path) if profile.source_path else None
    if path is None:
        return profile.gpu
    if path.parent == shipped_profile_path(profile.gpu).parent:
        return path.stem
    return str(path)


def gpu_kind_of_device(name: str) -> str:
    """The planner's GPU kind (planner.cluster.GPU_KINDS) for a device name as torch reports it ('NVIDIA H200'),
    'cpu' for the CPU; a GPU kind given already maps to itself. The profiler records this kind in a profile and
    `plan validate` the device name in its results, so `plan calibrate` can tell which rows a profile's GPU
    measured."""
    n = name.upper()
    if "H200" in n:
        return "h200-nvl" if "NVL" in n else "h200-sxm"
    if "H100" in n:
        return "h100-pcie" if "PCIE" in n else ("h100-nvl" if "NVL" in n else "h100-sxm")
    if "A100" in n and "80GB" in n:
        return "a100-80gb"
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "unknown-gpu"


def load_profile(path: str | None, gpu: str, other_gpu_ok: bool = False) -> Profile:
    """The profile at `path`, or the default for `gpu` (default_profile_path); one measured on another GPU is
    refused (PlanError), or only warned about with `other_gpu_ok` (--allow-other-gpu-profile)."""
    if path is None:
        p = default_profile_path(gpu)
        if not p.exists():
            raise PlanError(f"no profile ships for GPU '{gpu}'; run `plan profile` on one and pass --profile")
        prof = Profile.load(p)
    else:
        prof = Profile.load(resolve_profile_path(path))
    if prof.gpu != gpu and not other_gpu_ok:  # a shipped default is checked too: its file name proves nothing
        raise PlanError(f"profile '{path or p}' was measured on {prof.gpu}, but the plan is for {gpu}; measure "
                        f"one with `plan profile` on a {gpu}, or pass --allow-other-gpu-profile to price it with {prof.gpu}'s timings")
    if prof.gpu != gpu:
        warnings.warn(f"profile '{path or p}' was measured on {prof.gpu}, but the plan is for {gpu}", stacklevel=2)
    return prof
