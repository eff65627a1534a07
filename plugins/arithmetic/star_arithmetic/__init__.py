"""n-digit addition with a scratchpad for star-engine: the ``addition`` task
and the ``addition_target`` hint."""

from .formats import extract_result, rationale_completion, scratchpad
from .task import AdditionTask, TargetHint

__all__ = ["AdditionTask", "TargetHint", "extract_result", "rationale_completion", "scratchpad"]
