"""The registry of pipeline schedules: a plan's layout names one (Layout.schedule), and the memory model, the cost
model, the bounds, the search's CP-SAT objective and the runtime's executor ask it (planner/schedules/base.py says
what a schedule states). Adding a schedule is one subclass of PipelineSchedule and one register_schedule call."""
from __future__ import annotations

from planner.errors import PlanError
from planner.schedules.base import Action, PipelineSchedule, num_micro_batches
from planner.schedules.dual_pipe import DualPipe
from planner.schedules.interleaved import Interleaved
from planner.schedules.one_f_one_b import OneFOneB

SCHEDULES: dict[str, PipelineSchedule] = {}
"""Every known schedule by its name."""


def register_schedule(schedule: PipelineSchedule) -> PipelineSchedule:
    """Make `schedule` known by its name (a name registered again is replaced); returns it."""
    if not schedule.name:
        raise ValueError("a pipeline schedule needs a name")
    SCHEDULES[schedule.name] = schedule
    return schedule


def schedule_named(name: str) -> PipelineSchedule:
    """The registered schedule called `name`; a PlanError in one sentence when there is none."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise PlanError(f"unknown pipeline schedule {name!r}; known: {', '.join(SCHEDULES)}") from None


def default_schedule_name(vpp: int) -> str:
    """The schedule a layout that names none runs: interleaved 1F1B with virtual stages, else 1F1B."""
    return INTERLEAVED.name if vpp > 1 else ONE_F_ONE_B.name


ONE_F_ONE_B = register_schedule(OneFOneB())
INTERLEAVED = register_schedule(Interleaved())
DUAL_PIPE = register_schedule(DualPipe())

__all__ = ["Action", "PipelineSchedule", "num_micro_batches", "SCHEDULES", "register_schedule", "schedule_named",
           "default_schedule_name", "ONE_F_ONE_B", "INTERLEAVED", "DUAL_PIPE"]
