"""Registers the ``gsm8k`` task, the ``gsm8k_answer`` hint formatter and lm-evaluation-harness's
GSM8K checkers ``gsm8k_strict`` and ``gsm8k_flexible``."""

from star_engine import hookimpl

from .lmeval import FlexibleChecker, StrictChecker
from .task import AnswerHint, GSM8KTask


@hookimpl
def register_tasks(register):
    register("gsm8k", GSM8KTask)


@hookimpl
def register_hint_formatters(register):
    register("gsm8k_answer", AnswerHint)


@hookimpl
def register_checkers(register):
    register("gsm8k_strict", StrictChecker)
    register("gsm8k_flexible", FlexibleChecker)
