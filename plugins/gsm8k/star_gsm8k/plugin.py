"""Registers the ``gsm8k`` task and the ``gsm8k_answer`` hint formatter."""

from star_engine import hookimpl

from .task import AnswerHint, GSM8KTask


@hookimpl
def register_tasks(register):
    register("gsm8k", GSM8KTask)


@hookimpl
def register_hint_formatters(register):
    register("gsm8k_answer", AnswerHint)
