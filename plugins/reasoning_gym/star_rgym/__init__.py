"""reasoning-gym's procedurally generated datasets for star-engine: the ``reasoning_gym`` task,
the ``reasoning_gym_score`` checker (each dataset's own ``score_answer``) and the
``reasoning_gym_answer`` hint."""

from .components import AnswerHint, ScoreChecker
from .task import ReasoningGymTask

__all__ = ["AnswerHint", "ReasoningGymTask", "ScoreChecker"]
