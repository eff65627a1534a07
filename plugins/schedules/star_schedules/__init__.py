"""Step schedules of the original STaR for star-engine (plugin ``schedules``)."""

from .schedules import EpochsSchedule, ExponentialGrowSchedule, SteadyGrowSchedule

__all__ = ["EpochsSchedule", "ExponentialGrowSchedule", "SteadyGrowSchedule"]
