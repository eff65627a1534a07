"""Registers the ``addition`` task and the ``addition_target`` hint formatter."""

from star_engine import hookimpl

from .task import AdditionTask, TargetHint


@hookimpl
def register_tasks(register):
    register("addition", AdditionTask)


@hookimpl
def register_hint_formatters(register):
    register("addition_target", TargetHint)
