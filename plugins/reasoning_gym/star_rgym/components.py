"""The ``reasoning_gym_score`` checker and the ``reasoning_gym_answer`` hint formatter."""

from __future__ import annotations

import math

from typing import Annotated

from star_engine import Example, UserError, Verdict, between
from star_engine.helpers import is_number

from .formats import HINT, hint_line, hinted
from .gold import resolve
from .library import quiet, rg


class ScoreChecker:
    """``reasoning_gym_score``: the dataset's own ``score_answer(extracted, entry)``; right when
    the score reaches ``threshold`` (default 1.0: full marks; reasoning-gym gives partial
    credit, e.g. 0.01 for a well-formed wrong answer in some datasets). The entry comes from
    the gold answer (``star_rgym.gold``). No answer, a score_answer that raises on odd input,
    or a score that is not a finite number: a wrong answer, never a crash."""

    def __init__(self, *, threshold: Annotated[float, between(0, 1, lo_open=True)] = 1.0) -> None:
        self.threshold = threshold  # scores are in [0, 1]
        rg()

    def score(self, extracted: str | None, gold_answer: str) -> float:
        """The dataset's score of ``extracted`` against the entry ``gold_answer`` refers to
        (0.0 for no answer or a score_answer that fails)."""
        dataset, entry = resolve(gold_answer, "reasoning_gym_score")
        if extracted is None:
            return 0.0
        try:
            with quiet():
                value = dataset.score_answer(extracted, entry)
        except Exception:  # noqa: BLE001  (prime_factorization raises on a non-numeric answer)
            return 0.0
        if not is_number(value) or not math.isfinite(value):
            return 0.0
        return float(value)

    def check_gold(self, gold_answer: str) -> bool:
        """Whether ``gold_answer`` can be scored: a reasoning_gym task's reference to an entry that
        still draws the same (otherwise a UserError saying why). The core asks it once per
        question when it loads the data, where it has this optional Checker method."""
        resolve(gold_answer, "reasoning_gym_score")
        return True

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        """Right when the score reaches ``threshold``; the score itself is the verdict's graded
        ``score`` (what a tuner sweeps a reward threshold over: B-STaR's ``balance`` tuner)."""
        score = self.score(extracted, gold)
        return Verdict(extracted, score >= self.threshold, score=score)


class AnswerHint:
    """``reasoning_gym_answer``: the dataset's answer on a ``Hint:`` line between the question
    and ``Answer:``. Leak strings: that line, and ``Hint:``."""

    def context(self, task, example: Example) -> str:
        return hinted(example.question, _answer(example))

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return (hint_line(_answer(example)), HINT.strip())


def _answer(example: Example) -> str:
    answer = example.fields.get("answer")
    if not isinstance(answer, str):
        raise UserError(f"reasoning_gym_answer: example {example.id!r} is not a reasoning_gym task's (no answer "
                        f"field): this hint works with task.dataset = \"reasoning_gym\" only")
    return answer
