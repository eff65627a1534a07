"""Registers the ``math_verify`` checker."""

from star_engine import hookimpl

from .checker import MathVerifyChecker


@hookimpl
def register_checkers(register):
    register("math_verify", MathVerifyChecker)
