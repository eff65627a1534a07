"""Before a run: its components tried on a few of its own questions (``validate`` and ``run``, in
``runner.preflight``), so that a checker that cannot fit the task is named before anything is
written, not found in a run's first table of zeros.

- ``task.checker`` judges the task's gold completions (``Task.gold_completion``; the direct ones
  when the task has no gold rationales) of the first ``TRIES`` questions with a gold answer of
  each split, as a generation is judged (trimmed, extracted, checked): when it judges every one
  of them wrong, or the task extracts no answer from any, that is an error naming
  ``task.checker`` with one example (the ``math_verify`` checker on addition's digit answers,
  or on CommonsenseQA's letters). One gold completion judged wrong among right ones is the data's
  business, not the checker's.
- the hint formatter (rationalization) writes its prompt for the first ``TRIES`` training questions.
"""

from __future__ import annotations

from .api import Example
from .capabilities import Trims
from .errors import UserError
from .experiment import Experiment

TRIES = 3


def _gold(exp: Experiment, ex: Example) -> str | None:
    """``ex``'s gold completion (the direct one when the task has no gold rationale); None when the
    task has neither."""
    for direct in dict.fromkeys((exp.config.task.direct, True)):
        try:
            with exp.calling(exp.task, "gold_completion"):
                return exp.task.gold_completion(ex, direct)
        except UserError:
            continue
    return None


def _judged(exp: Experiment, ex: Example, completion: str) -> tuple[str | None, bool]:
    """(the answer the task extracts from ``completion``, the checker's verdict on it)."""
    text = completion
    if isinstance(exp.task, Trims):
        with exp.calling(exp.task, "trim"):
            text = exp.task.trim(text)
    with exp.calling(exp.task, "extract"):
        extracted = exp.task.extract(text)
    with exp.calling(exp.checker, "check"):
        verdict = exp.checker.check(text, extracted, ex.answer)
    return extracted, bool(getattr(verdict, "correct", False))


def try_components(exp: Experiment) -> None:
    """The checker on a few gold completions of each split, the hint formatter on a few training
    questions (module docstring); a component that fails is one line naming its key."""
    for split, examples in exp.splits.items():
        tried = []
        for ex in [ex for ex in examples if ex.answer][:TRIES]:
            completion = _gold(exp, ex)
            if completion is None:
                return  # the task writes no gold completion: nothing to try the checker on
            tried.append((ex, completion, *_judged(exp, ex, completion)))
        if tried and not any(right for *_, right in tried):
            ex, completion, extracted, _ = tried[0]
            what = ("the task extracts no answer from them" if all(t[2] is None for t in tried) else
                    "it judges every one wrong")
            raise UserError(f"task.checker: {exp.checker_name!r} does not fit task {exp.config.task.dataset!r}: tried "
                            f"on the gold completions of {len(tried)} {split} questions, {what} (question {ex.id!r}: "
                            f"gold answer {ex.answer!r}, completion {completion[-120:]!r}, extracted {extracted!r}); "
                            f"choose a checker for this task's answers", key="task.checker")
    hint = exp.hint
    if hint is not None:
        for ex in exp.splits.get(exp.config.task.train_split, [])[:TRIES]:
            with exp.calling(hint, "context"):
                hint.context(exp.task, ex)
