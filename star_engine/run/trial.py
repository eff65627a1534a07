"""Before a run: its components tried on a few of its own questions (``validate`` and ``run``, in
``runner.preflight``), so that a checker that cannot fit the task is named before anything is
written, not found in a run's first table of zeros.

- ``task.checker`` judges the task's gold completions (``Task.gold_completion``; the direct ones
  when the task has no gold rationales) of the first ``TRIES`` questions with a gold answer of
  each split, as a generation is judged (trimmed, extracted, checked): when it judges every one
  of them wrong (or reads no answer from any), that is an error naming ``task.checker`` with one
  example (the ``math_verify`` checker on addition's digit answers,
  or on CommonsenseQA's letters). One gold completion judged wrong among right ones is the data's
  business, not the checker's.
- the task writes the question context (the prompt's end) of the first ``TRIES`` questions of
  each split, and the hint formatter (rationalization) its hinted context for the first
  ``TRIES`` training questions; the few-shot prompts are read when the experiment is built. A
  refusal there (a ``UserError``: the data does not suit the component, e.g. a hint formatter
  for letter choices on a question without choices) is an error naming ``task.dataset`` or
  ``task.hint``, the split and the question.
"""

from __future__ import annotations

from ..api import Example, Verdict
from ..capabilities import ChecksInContext, ChecksMany, Trims
from ..errors import PluginError, UserError
from .experiment import Experiment
from .verdicts import check_verdict, is_verdict

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


def _answer(exp: Experiment, completion: str) -> tuple[str, str | None]:
    """(``completion`` as the task keeps a generation, the answer it extracts from it)."""
    text = completion
    if isinstance(exp.task, Trims):
        with exp.calling(exp.task, "trim"):
            text = exp.task.trim(text)
    with exp.calling(exp.task, "extract"):
        extracted = exp.task.extract(text)
    exp.registry.returned(exp.task, "extract", extracted, extracted is None or isinstance(extracted, str),
                          "the answer (a str) or None")
    return text, extracted


def _verdicts(exp: Experiment, items: list[tuple[str, str | None, str]]) -> list[Verdict]:
    """The checker's verdicts on ``items`` (text, extracted, gold), as a stage asks for them:
    ``check_many`` at once when it has one (and no ``check_in``), else one at a time, each held
    to the protocol (``verdicts.check_verdict``)."""
    checker = exp.checker
    if isinstance(checker, ChecksMany) and not isinstance(checker, ChecksInContext):
        with exp.calling(checker, "check_many"):
            vs = checker.check_many(items)
        exp.registry.returned(checker, "check_many", vs, isinstance(vs, list) and len(vs) == len(items)
                              and all(is_verdict(v) for v in vs), f"a list of {len(items)} star_engine.Verdict")
        return list(vs)
    return [check_verdict(exp.registry, checker, None, t, e, g) for t, e, g in items]


def try_components(exp: Experiment) -> None:
    """The checker on a few gold completions of each split, the hint formatter on a few training
    questions (module docstring); a checker that does not fit is one line naming its key. A
    component that breaks its protocol or raises here is left to the stage that calls it, which
    names the plugin as a run always does (its traceback in the run's events)."""
    try:
        _try(exp)
    except UserError as e:
        if e.key == "task.checker":
            raise
    except Exception:  # noqa: BLE001 -- a plugin's fault: named where the run meets it
        pass
    _try_contexts(exp)


def _try_contexts(exp: Experiment) -> None:
    """The task's context on a few questions of each split; the hint formatter's on a few
    training questions (when the run rationalizes)."""
    tries: list[tuple[str, Example, str, object, str, tuple[object, ...]]] = [
        (split, ex, "task.dataset", exp.task, "context", (ex,))
        for split, examples in exp.splits.items() for ex in examples[:TRIES]]
    if exp.hint is not None:
        tries += [(exp.config.task.train_split, ex, "task.hint", exp.hint, "context", (exp.task, ex))
                  for ex in exp.splits.get(exp.config.task.train_split, [])[:TRIES]]
    for split, ex, key, component, method, args in tries:
        try:
            with exp.calling(component, method):
                getattr(component, method)(*args)
        except PluginError:
            return  # a plugin's fault (not a refusal of the data): named where the run meets it
        except UserError as e:
            raise UserError(f"{key}: cannot write the prompt of {split} question {ex.id!r}: {e}", key=key) from None


def _try(exp: Experiment) -> None:
    for split, examples in exp.splits.items():
        tried = []
        for ex in [ex for ex in examples if ex.answer][:TRIES]:
            completion = _gold(exp, ex)
            if completion is None:
                return  # the task writes no gold completion: nothing to try the checker on
            tried.append((ex, completion, *_answer(exp, completion)))
        if not tried or all(t[3] is None for t in tried):
            continue  # the task reads no answer from its own completions (its trim): not the checker's fit
        verdicts = _verdicts(exp, [(text, extracted, ex.answer) for ex, _, text, extracted in tried])
        if not any(v.correct for v in verdicts):
            ex, completion, _, extracted = tried[0]
            what = ("it reads no answer from them" if all(v.predicted is None for v in verdicts) else
                    "it judges every one wrong")
            raise UserError(f"task.checker: {exp.checker_name!r} does not fit task {exp.config.task.dataset!r}: tried "
                            f"on the gold completions of {len(tried)} {split} questions, {what} (question {ex.id!r}: "
                            f"gold answer {ex.answer!r}, completion {completion[-120:]!r}, extracted {extracted!r}); "
                            f"choose a checker for this task's answers", key="task.checker")
