"""Hook implementations: what this package adds to star-engine.

Found through the entry point ``example = "star_plugin_example.plugin"`` of the
group ``star_engine`` (see pyproject.toml). Each ``register_*`` hook is called
once when star-engine builds its registry; ``register(name, factory)`` takes a
callable whose keyword parameters are the component's TOML options.
"""

from __future__ import annotations

from star_engine import hookimpl

from .checker import UnitNumericChecker
from .task import AnswerHint, UnitConversionTask


@hookimpl
def register_tasks(register) -> None:
    register("unit_conversion", UnitConversionTask)


@hookimpl
def register_checkers(register) -> None:
    register("unit_numeric", UnitNumericChecker)


@hookimpl
def register_hint_formatters(register) -> None:
    register("unit_answer", AnswerHint)
