"""CommonsenseQA for star-engine: the ``cqa`` task and the ``cqa_correct`` hint."""

from .answers import extract_letter, first_line, original_letter
from .task import CorrectHint, CQATask

__all__ = ["CQATask", "CorrectHint", "extract_letter", "first_line", "original_letter"]
