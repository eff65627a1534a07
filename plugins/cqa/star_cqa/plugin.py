"""Registers the ``cqa`` task and the ``cqa_correct`` hint formatter."""

from star_engine import hookimpl

from .task import CorrectHint, CQATask


@hookimpl
def register_tasks(register):
    register("cqa", CQATask)


@hookimpl
def register_hint_formatters(register):
    register("cqa_correct", CorrectHint)
