"""CommonsenseQA for star-engine: the ``cqa`` task and the ``cqa_correct`` hint."""

from .task import CorrectHint, CQATask, extract_letter

__all__ = ["CQATask", "CorrectHint", "extract_letter"]
