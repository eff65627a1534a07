"""Hook implementation: registers the step schedules."""

from __future__ import annotations

from star_engine import hookimpl

from .schedules import EpochsSchedule, ExponentialGrowSchedule, SteadyGrowSchedule

SCHEDULES = {
    "epochs": EpochsSchedule,
    "steady_grow": SteadyGrowSchedule,
    "exponential_grow": ExponentialGrowSchedule,
}


@hookimpl
def register_schedules(register):
    for name, factory in SCHEDULES.items():
        register(name, factory)
