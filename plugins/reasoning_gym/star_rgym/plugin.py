"""Registers the ``reasoning_gym`` task, the ``reasoning_gym_score`` checker and the
``reasoning_gym_answer`` hint formatter. reasoning-gym itself is imported when one of them is
built (``star_rgym.library``)."""

from star_engine import hookimpl

from .components import AnswerHint, ScoreChecker
from .task import ReasoningGymTask


@hookimpl
def register_tasks(register):
    register("reasoning_gym", ReasoningGymTask)


@hookimpl
def register_checkers(register):
    register("reasoning_gym_score", ScoreChecker)


@hookimpl
def register_hint_formatters(register):
    register("reasoning_gym_answer", AnswerHint)
