"""Registers the ``code`` and ``code_expr`` tasks, the ``python_tests`` checker and the ``code_tests`` hint."""

from star_engine import hookimpl

from .checker import PythonTestsChecker
from .expr import CodeExprTask
from .task import CodeTask, TestsHint


@hookimpl
def register_tasks(register):
    register("code", CodeTask)
    register("code_expr", CodeExprTask)


@hookimpl
def register_checkers(register):
    register("python_tests", PythonTestsChecker)


@hookimpl
def register_hint_formatters(register):
    register("code_tests", TestsHint)
