"""GSM8K for star-engine: the ``gsm8k`` task and the ``gsm8k_answer`` hint."""

from .answers import final_answer, normalize_number
from .task import AnswerHint, GSM8KTask

__all__ = ["GSM8KTask", "AnswerHint", "final_answer", "normalize_number"]
