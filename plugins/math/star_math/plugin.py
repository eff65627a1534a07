"""Registers the ``math`` task and the ``math_answer`` hint formatter."""

from star_engine import hookimpl

from .task import AnswerHint, MATHTask


@hookimpl
def register_tasks(register):
    register("math", MATHTask)


@hookimpl
def register_hint_formatters(register):
    register("math_answer", AnswerHint)
