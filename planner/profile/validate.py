"""Validation of a loaded profile: every number finite and in range, each failure named by its field."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.collectives import COLLECTIVES
from planner.errors import PlanError
from planner.profile.grouped import GROUPED_DIRECTIONS, GroupedGemmPoint
from planner.profile.records import EFFICIENCY_TERMS, HostOverheads

if TYPE_CHECKING:  # planner.profile.core calls _validate as it loads a profile
    from planner.profile.core import Profile


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


def _grouped_points(points) -> list[GroupedGemmPoint]:
    return [GroupedGemmPoint(direction=str(p["direction"]), experts=_whole(p["experts"]), rows=_whole(p["rows"]),
                             n=_whole(p["n"]), k=_whole(p["k"]), grouped_s=_number(p["grouped_s"]),
                             dense_s=_number(p["dense_s"])) for p in points]


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
    for i, g in enumerate(p.grouped_points):
        name = f"grouped_gemm.points[{i}]"
        if g.direction not in GROUPED_DIRECTIONS:
            raise PlanError(f"{check.where} is corrupted: {name}.direction is {g.direction!r}, not one of "
                            f"{', '.join(GROUPED_DIRECTIONS)}")
        for field_name in ("experts", "rows", "n", "k"):
            check.size(f"{name}.{field_name}", getattr(g, field_name))
        check.positive(f"{name}.grouped_s", g.grouped_s)
        check.positive(f"{name}.dense_s", g.dense_s)


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
        if c.op not in COLLECTIVES:
            raise PlanError(f"{check.where} is corrupted: {name}.op is '{c.op}', not one of "
                            f"{', '.join(COLLECTIVES)}")
        check.size(f"{name}.group_size", c.group_size)
        check.non_negative(f"{name}.latency_s", c.latency_s)
        check.positive(f"{name}.bus_bandwidth_bytes_per_s", c.bus_bandwidth_bytes_per_s)
        check.non_negative(f"{name}.fill_ratio", c.fill_ratio)
        check.non_negative(f"{name}.fill_s", c.fill_s)
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
