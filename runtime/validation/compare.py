"""`plan validate`'s report: the prediction against the measurement, step time, peak memory and the components the
runtime times (optimizer, pipeline bubble, the traced step's GPU compute / exposed communication / idle)."""
from __future__ import annotations

from dataclasses import dataclass

from planner.calibrate import recompute_text
from planner.plan import Plan
from planner.report import host_paced, host_paced_note
from runtime import gpu_monitor
from runtime.trace_analysis import RankComponents
from runtime.validation.measure import TracedStep


def _err(pred: float | None, meas: float | None) -> str:
    """The prediction's relative error ('+12.3%'); blank when either is missing or the measurement is not positive."""
    if pred is None or meas is None or meas <= 0:
        return ""
    return f"{(pred - meas) / meas:+.1%}"


def _num(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.4g}{unit}"


@dataclass(frozen=True)
class Component:
    """A part of the traced step that is measured and predicted alike."""
    label: str
    predicted_keys: tuple[str, ...]
    """The cost model's breakdown_s keys it holds (planner/cost/step.py, predict)."""
    measured: str
    """The RankComponents attribute that measures it."""
    measured_text: str


COMPONENTS = (
    Component("GPU compute", ("compute", "recompute", "optimizer"), "compute_s", "non-NCCL kernels"),
    Component("exposed communication", ("tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_comm"),
              "exposed_communication_s", "NCCL kernels with no compute kernel beside them"),
    Component("GPU idle", ("bubble", "host"), "idle_s", "span - busy (pipeline bubble, host gaps, waits)"),
)


def predicted_components_s(breakdown: dict) -> dict[str, float]:
    return {c.label: sum(breakdown.get(k, 0.0) for k in c.predicted_keys) for c in COMPONENTS}


def measured_components_s(rank: RankComponents) -> dict[str, float]:
    return {c.label: getattr(rank, c.measured) for c in COMPONENTS}


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "-"


def components_report(pred, traced: TracedStep | str | None, steady_step_s: float) -> list[str]:
    """The traced step's block of the report: measured components on the compared rank against the prediction's,
    in seconds and as fractions of the traced span / the predicted step. `traced`: a reason string when the
    step was not traced, None when it was not asked for (no lines)."""
    if traced is None:
        return []
    head = "components of one extra step, traced after the measured ones (torch.profiler, GPU kernels)"
    if isinstance(traced, str):
        return [f"{head}: {traced}"]
    rank = traced.compared_rank()
    if rank.span_s <= 0:
        return [f"{head}: the trace holds no GPU kernels"]
    lines = [f"{head}:",
             f"  traced step {traced.step}: span {rank.span_s:.4g} s on rank {rank.rank} (the largest of "
             f"{len(traced.ranks)} rank(s)); steady median step {steady_step_s:.4g} s "
             f"({_err(rank.span_s, steady_step_s) or '-'} traced against steady)",
             f"{'':<34}{'predicted':>12}{'measured':>12}{'error':>9}{'pred/step':>11}{'meas/span':>11}"]
    predicted, measured = predicted_components_s(pred.breakdown_s), measured_components_s(rank)
    for c in COMPONENTS:
        p, m = predicted[c.label], measured[c.label]
        lines.append(f"{'  ' + c.label:<34}{p:>12.4g}{m:>12.4g}{_err(p, m):>9}"
                     f"{_share(p, pred.step_s):>11}{_share(m, rank.span_s):>11}")
    for c in COMPONENTS:
        lines.append(f"    {c.label}: predicted {' + '.join(c.predicted_keys)}; measured {c.measured_text}")
    mapped = {k for c in COMPONENTS for k in c.predicted_keys}
    other = [f"{k} {v:.4g}" for k, v in pred.breakdown_s.items() if k not in mapped and v]
    if other:
        lines.append("    predicted but in no component: " + ", ".join(other))
    by_rank = sorted(traced.ranks, key=lambda r: r.rank)
    lines.append("  exposed communication per rank (s): "
                 + ", ".join(f"{r.rank}: {r.exposed_communication_s:.4g}" for r in by_rank))
    return lines


def report(plan: Plan, pred, meas: dict) -> str:
    """The printed comparison of one plan: `pred` (planner.cost.evaluate) against `meas` (measure._steady's dict,
    with the traced step under 'components' and the GPUs' state under 'gpu_state' where there are some)."""
    b = pred.breakdown_s
    lines = [f"{plan.model.name} {plan.layout.short()} mb{plan.layout.micro_batch} sharding {plan.layout.sharding} "
             f"seq {plan.training.seq_len} global batch {plan.training.global_batch} recompute {recompute_text(plan.stages)}",
             f"steady state: median of {meas['steps']} steps (range {meas['step_s_min']:.4g}-{meas['step_s_max']:.4g} s)",
             f"{'':<34}{'predicted':>12}{'measured':>12}{'error':>9}",
             f"{'step time (s)':<34}{pred.step_s:>12.4g}{meas['step_s']:>12.4g}{_err(pred.step_s, meas['step_s']):>9}"]
    pmem = max(pred.memory_gib_per_rank)
    lines.append(f"{'peak memory, max over ranks (GiB)':<34}{pmem:>12.4g}{_num(meas['mem_gib']):>12}"
                 f"{_err(pmem, meas['mem_gib']):>9}")
    if meas["mem_by_rank"]:
        lines.append(f"  per rank measured: {meas['mem_by_rank'].replace(';', ', ')}; predicted per pipeline rank: "
                     + ", ".join(f"{m:.4g}" for m in pred.memory_gib_per_rank))
    lines.append("components (s, along the slowest pipeline rank):")
    timed = 0.0
    m_timed = 0.0
    if meas["optimizer_s"] is not None:
        lines.append(f"{'  optimizer (clip + AdamW)':<34}{b.get('optimizer', 0):>12.4g}{meas['optimizer_s']:>12.4g}"
                     f"{_err(b.get('optimizer', 0), meas['optimizer_s']):>9}")
        timed += b.get("optimizer", 0.0)
        m_timed += meas["optimizer_s"]
    if plan.layout.pp > 1 and meas["bubble_frac"] is not None:
        mb = meas["bubble_frac"] * meas["step_s"]
        lines.append(f"{'  pipeline bubble':<34}{b.get('bubble', 0):>12.4g}{mb:>12.4g}{_err(b.get('bubble', 0), mb):>9}")
        timed += b.get("bubble", 0.0)
        m_timed += mb
    rest_p, rest_m = pred.step_s - timed, meas["step_s"] - m_timed
    lines.append(f"{'  rest (compute + exposed comm)':<34}{rest_p:>12.4g}{rest_m:>12.4g}{_err(rest_p, rest_m):>9}")
    untimed = [k for k in b if k not in ("optimizer", "bubble") and b[k] > 0]
    if untimed:
        traced = isinstance(meas.get("components"), TracedStep)
        where = "timed apart in the traced step below" if traced else "not timed apart by the runtime"
        lines.append(f"    predicted split of the rest ({where}): " + ", ".join(f"{k} {b[k]:.4g}" for k in untimed))
    lines.extend(components_report(pred, meas.get("components"), meas["step_s"]))
    if host_paced(pred):
        lines.append(host_paced_note(pred))
    gpu_line = gpu_monitor.describe(meas.get("gpu_state"))
    if gpu_line:
        lines.append(gpu_line)
    return "\n".join(lines)
