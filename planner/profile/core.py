"""The Profile dataclass and the questions the cost model asks it (see planner/profile/__init__.py)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.errors import PlanError, read_json
from planner.profile.grouped import GroupedGemmPoint, dense_equivalent, grouped_over_dense
from planner.profile.records import (FP8_GEMM_SPEEDUP, PROFILE_FORMAT, PROFILE_VERSION, CollectiveFit,
                                     HostOverheads)
from planner.profile.table import GEMM_LAUNCH_S, _collective_lookup, _gemm_s_cached, _GemmTable
from planner.profile.validate import _collective_points, _gemm_points, _grouped_points, _number, _validate, _whole


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
    """Fixed time per kernel beside its bytes or FLOPs (attention, elementwise, memory-bound), as the profiler measured
    it for eager issue (host time per small op)."""
    graph_kernel_s: float | None = None
    """Fixed GPU time per kernel (GEMMs included) when the step is replayed as a CUDA graph (Layout.cuda_graph): no
    host launch, only the kernels' own start and drain. Fitted on measured graphed steps by
    benchmarks/fit_graph_kernel.py (provenance.calibrations says on which); None: graphed steps are priced with
    the eager terms, kernel_launch_s and GEMM_LAUNCH_S."""
    gemm_launch_s: float = field(default=GEMM_LAUNCH_S, repr=False)
    """Fixed time per GEMM beside its table time (not stored: GEMM_LAUNCH_S, or graph_kernel_s in for_graph_replay)."""
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
    """Measured host time per layer (runtime/profiler/host.py); None: no host floor (a profile measured without the host probe)."""
    wgrad_points: list[tuple[int, int, int, float]] = field(default_factory=list)
    """(m, n, k, seconds) of weight-gradient GEMMs [m,k] x [k,n] accumulated into fp32 (k = tokens); empty in
    profiles measured without them, where wgrad_s falls back to gemm_s."""
    fp8_points: list[tuple[int, int, int, float]] = field(default_factory=list)
    """(m, n, k, seconds) of FP8 GEMMs as runtime/parallel/fp8.py runs them (per-tensor scaling of both bf16
    operands included), forward and input-gradient layouts; empty in profiles measured without them and on devices
    without FP8, where fp8_gemm_s is modelled."""
    grouped_points: list[GroupedGemmPoint] = field(default_factory=list)
    """The MoE experts' grouped GEMMs against dense GEMMs of all their rows (planner/profile/grouped.py,
    runtime/profiler/grouped.py); empty in profiles without them, where grouped_gemm_s answers None."""

    # -- queries -------------------------------------------------------------
    def eff(self, term: str) -> float:
        return self.efficiency.get(term, 1.0)

    @property
    def peak_gemm_flops(self) -> float:
        return max(2.0 * m * n * k / t for m, n, k, t in self.gemm_points)

    def gemm_s(self, m: int, n: int, k: int) -> float:
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        return _gemm_s_cached(self._gemm_key(), m, n, k) + self.gemm_launch_s

    def for_graph_replay(self) -> "Profile":
        """This profile as a step replayed from a CUDA graph sees it: every kernel's fixed term is graph_kernel_s
        (unchanged where the profile has none)."""
        if self.graph_kernel_s is None:
            return self
        cached = self.__dict__.get("_graph_view")
        if cached is None:
            cached = replace(self, kernel_launch_s=self.graph_kernel_s, gemm_launch_s=self.graph_kernel_s)
            for k, v in self.__dict__.items():  # the GEMM tables and kernel rates are the same: share them
                if k.startswith(("_gk_", "_kernel_rates")):
                    cached.__dict__[k] = v
            self.__dict__["_graph_view"] = cached
        return cached

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
            return _gemm_s_cached(self._gemm_key("fp8"), m, n, k) + self.gemm_launch_s
        bf16 = self.gemm_s(m, n, k) - self.gemm_launch_s
        t_mem = (m * k + k * n + 2 * m * n) / self.copy_bandwidth_bytes_per_s
        scaling = 5.0 * (m * k + n * k) / self.copy_bandwidth_bytes_per_s + 4 * self.kernel_launch_s
        return max(bf16 / FP8_GEMM_SPEEDUP, t_mem) + scaling + self.gemm_launch_s

    @property
    def kernels_timed_at_power_cap(self) -> bool:
        """Whether the profiler timed this profile's kernels with the GPU held at its power cap
        (runtime/profiler/timing.py); False: in short bursts, at whatever clock the GPU was at.
        Kernels timed to compare with it, or to add to it, are timed the same way."""
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

    def grouped_gemm_s(self, direction: str, experts: int, rows: int, n: int, k: int,
                       table: str | None = None) -> float | None:
        """One grouped GEMM over `experts` experts of `rows` rows each, weight [n, k], in `direction` (fwd, dgrad,
        wgrad; planner/profile/grouped.py): the measured grouped-over-dense ratio at those rows per expert times
        this profile's dense GEMM of all the rows, plus one launch. None where the profile measured none.
        table: the dense GEMM's table when not the measured call's own ('fp8': an FP8 grouped GEMM, modelled as the
        FP8 dense GEMM of all the rows at the bf16 grouped call's measured ratio)."""
        if experts <= 0 or rows <= 0:
            return 0.0
        cache = self.__dict__.setdefault("_grouped_cache", {})
        key = (direction, experts, rows, n, k)
        if key not in cache:
            cache[key] = grouped_over_dense(tuple(self.grouped_points), direction, experts, rows, n, k)
        if cache[key] is None:
            return None
        ratio, priced_rows = cache[key]
        own, gm, gn, gk = dense_equivalent(direction, experts * priced_rows, n, k)
        return ratio * (self.gemm_table_s(table or own, gm, gn, gk) - self.gemm_launch_s) + self.gemm_launch_s

    def wgrad_s(self, m: int, n: int, k: int) -> float:
        if not self.wgrad_points:
            return self.gemm_s(m, n, k)
        if m <= 0 or n <= 0 or k <= 0:
            return 0.0
        return _gemm_s_cached(self._gemm_key("wgrad"), m, n, k) + self.gemm_launch_s

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
        96 and 112 run in the time of 128 within 2%, forward and backward, and 160 in that of 192, as
        benchmarks/attention_head_dims.py measures); above the largest measured, itself (at the nearest one's
        rate)."""
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
            **({"graph_kernel_s": self.graph_kernel_s} if self.graph_kernel_s is not None else {}),
            "collectives": [{"op": c.op, "link": c.link, "group_size": c.group_size, "latency_s": c.latency_s,
                             "bus_bandwidth_bytes_per_s": c.bus_bandwidth_bytes_per_s, "measured": c.measured,
                             "points": [list(p) for p in c.points],
                             **({"fill_ratio": c.fill_ratio, "fill_s": c.fill_s} if c.fill_s or c.fill_ratio else {})}
                            for c in self.collectives],
            "overlap_hidden_fraction": self.overlap_hidden_fraction,
            "efficiency": self.efficiency,
            "extras": self.extras,
            **({"host": self.host.to_dict()} if self.host is not None else {}),
            **({"grouped_gemm": {"points": [p.to_dict() for p in self.grouped_points]}}
               if self.grouped_points else {}),
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
                graph_kernel_s=_number(d["graph_kernel_s"]) if d.get("graph_kernel_s") is not None else None,
                collectives=[CollectiveFit(op=str(c["op"]), link=str(c["link"]), group_size=_whole(c["group_size"]),
                                           latency_s=_number(c["latency_s"]),
                                           bus_bandwidth_bytes_per_s=_number(c["bus_bandwidth_bytes_per_s"]),
                                           measured=bool(c["measured"]),
                                           points=_collective_points(c.get("points", ())),
                                           fill_ratio=_number(c.get("fill_ratio", 0.0)),
                                           fill_s=_number(c.get("fill_s", 0.0)))
                             for c in d["collectives"]],
                overlap_hidden_fraction={str(k): _number(v) for k, v in d["overlap_hidden_fraction"].items()},
                efficiency={str(k): _number(v) for k, v in (d.get("efficiency") or {}).items()},
                source_path=source, extras=dict(d.get("extras") or {}),
                host=HostOverheads.from_measurement(d["host"]) if d.get("host") is not None else None,
                wgrad_points=_gemm_points(gemm.get("wgrad_points", [])),
                fp8_points=_gemm_points(gemm.get("fp8_points", [])),
                grouped_points=_grouped_points((d.get("grouped_gemm") or {}).get("points", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"{where} is corrupted ({exc.__class__.__name__}: {exc})") from None
        _validate(prof, where)
        return prof

    @staticmethod
    def load(path: Path) -> "Profile":
        d = read_json(path, "profile")
        return Profile.from_dict(d, str(path))


_TABLE_LOOKUP = {"mm": "gemm_s", "wgrad": "wgrad_s", "fp8": "fp8_gemm_s"}
"""GEMM table name -> the Profile method that answers from it (Profile.gemm_table_s)."""
