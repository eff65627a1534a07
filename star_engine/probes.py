"""What a sampling tuner (``api.SamplingTuner``, ``generation.tuner``) is given and returns: the
core's probe of the iteration's model (``Probe``, ``ReferenceProbe``), its judged answers
(``ProbeSample``) and the tuner's choice (``TuningChoice``). Part of the plugin API: exported by
``star_engine`` and by ``star_engine.api``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Probe", "ProbeSample", "ReferenceProbe", "TuningChoice"]


@dataclass(frozen=True)
class ProbeSample:
    """One answer of a tuner's probe (``SamplingTuner``): the trimmed ``text`` the model wrote
    for question ``question_id`` (its ``sample``-th), the answer found in it and the task's
    checker's verdict (``score``: its graded reward, ``Verdict.score``; None when it gives none)."""

    question_id: str
    sample: int
    text: str
    predicted: str | None
    correct: bool
    score: float | None = None


Probe = Callable[[float, Sequence[str], int], list[list[ProbeSample]]]
"""``probe(temperature, question_ids, samples)``: the model of the iteration samples ``samples``
answers to each of ``question_ids`` (ids of the questions the tuner was given) at
``temperature``, with the generation's prompt, top-p and length; returns, per question in that
order, its answers, judged. Stored by the core (a resumed run reads them back). The core's probe
is also a ``ReferenceProbe``."""


@runtime_checkable
class ReferenceProbe(Protocol):
    """A ``Probe`` that also gives each question's reference solution, as the core's probe does:
    ``references(question_ids)`` returns, per question in that order, the task's gold completion
    (``Task.gold_completion(example, task.direct)``, trimmed as the probe's answers are), which
    B-STaR counts among a question's samples as a right one. A task without one for a question
    raises its ``UserError``."""

    def __call__(self, temperature: float, question_ids: Sequence[str], samples: int) -> list[list[ProbeSample]]:
        ...

    def references(self, question_ids: Sequence[str]) -> list[str]:
        ...


@dataclass(frozen=True)
class TuningChoice:
    """What a ``SamplingTuner`` chose: the ``temperature`` the iteration samples at, and one
    row per candidate it tried (``{"temperature": ..., "score": ..., <more columns>}``, plain
    numbers), stored in the iteration's ``tuning.parquet``."""

    temperature: float
    candidates: Sequence[Mapping[str, float]]
