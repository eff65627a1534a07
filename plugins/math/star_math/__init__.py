"""MATH for star-engine: the ``math`` task and the ``math_answer`` hint."""

from .answers import extract, last_boxed
from .task import AnswerHint, MATHTask

__all__ = ["MATHTask", "AnswerHint", "extract", "last_boxed"]
