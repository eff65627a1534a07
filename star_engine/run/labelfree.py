"""Training without gold answers: the run's rules for a ``task.reward`` that judges a question's
samples together (``capabilities.ChecksGroups``) or never reads the gold answer
(``capabilities.LabelFree``), and the collapse guard.

The rules, checked when the experiment is built (``experiment.build``, ``load_splits``), before
anything is written: a group checker judges training samples only (``task.reward``; not
``task.checker`` nor an ``evaluation.checkers`` entry, which judge one answer at a time), and
``generation.samples_per_question`` is at least its ``min_group``; a label-free reward leaves
rationalization off (its hint is the gold answer); a training split (``task.train_split``) with
questions that have no gold answer ("") is refused unless what judges the training samples is
label-free, and is then not screened by the task's checker when no evaluation reads it.

The collapse guard (``experiment.collapse_patience`` = P > 0): self-training on a label-free
reward can drive the model to agree with itself while its accuracy collapses (Shafayat et al.
2025, "Can large reasoning models self-train?", arXiv 2505.21444: the agreement of the majority
vote climbs towards 1 while held-out accuracy falls). Over the iterations that have both a
train row's ``agreement`` and an accuracy of the first evaluation split (class "all"), in
order, the guard stops the run at iteration n when the last P steps between consecutive ones,
ending at n, each raised the agreement and lowered that accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from ..api import Checker, Example
from ..capabilities import ChecksGroups, LabelFree
from ..errors import UserError

log = structlog.get_logger("star_engine")


def label_free(checker: Checker) -> bool:
    """Whether ``checker``'s verdicts never read the gold answer (``LabelFree.label_free``)."""
    return isinstance(checker, LabelFree) and checker.label_free is True


def check_components(config: Any, checker: Checker, entries: Sequence[Checker], reward: Checker | None) -> None:
    """The rules on group and label-free checkers (the module's docstring) that ``config`` (a
    ``config.Config``), the task's ``checker``, the ``[evaluation] checkers`` (``entries``, in
    their order) and ``task.reward`` (None: the checker) break: one ``UserError`` naming the key."""
    t = config.task
    for key, name, c in [("task.checker", t.checker["name"], checker),
                         *((f"evaluation.checkers[{i}]", ref["name"], c) for i, (ref, c) in
                           enumerate(zip(config.evaluation.checkers, entries)))]:
        if isinstance(c, ChecksGroups):
            raise UserError(f"{key}: checker {name!r} judges a question's samples together (check_group): it "
                            f"can only be task.reward, which judges the training samples", key=key)
    if reward is None or config.training.source != "generated":
        return
    name, k = t.reward["name"], config.generation.samples_per_question
    least = int(reward.min_group) if isinstance(reward, ChecksGroups) else 1
    if k < least:
        raise UserError(f"generation.samples_per_question: {k}, and task.reward {name!r} judges a question's "
                        f"samples together, at least {least}; set generation.samples_per_question >= {least}",
                        key="generation.samples_per_question")
    if label_free(reward) and config.rationalization.enabled:
        raise UserError(f"rationalization.enabled: rationalization hints the gold answer, which task.reward "
                        f"{name!r} does without (it is label-free); set rationalization.enabled = false",
                        key="rationalization.enabled")


def screens_training_split(config: Any, judge: Checker) -> bool:
    """Whether the task's checker screens the gold answers of the training split: not when
    ``judge`` (what judges the training samples) is label-free and no evaluation reads the split."""
    return not (label_free(judge) and config.task.train_split not in config.evaluation.splits
                and config.training.source == "generated")


def check_training_split(config: Any, examples: Sequence[Example], judge: Checker, name: str) -> None:
    """The training split's questions without a gold answer ("") are refused unless ``judge``
    (named ``name``: what judges the training samples) is label-free."""
    missing = [ex.id for ex in examples if ex.answer == ""]
    split = config.task.train_split
    if not missing or config.training.source != "generated" or label_free(judge):
        return
    raise UserError(f"task.train_split: split {split!r} has {len(missing)} question(s) without a gold answer "
                    f"(e.g. {missing[0]!r}), and {name!r}, which judges the training samples, needs one; train on "
                    f"a labelled split, or set a label-free task.reward (e.g. majority_vote)", key="task.train_split")


# -- the collapse guard --------------------------------------------------------------------

def _points(rows: Sequence[dict], split: str) -> list[tuple[int, float, float]]:
    """(iteration, train agreement, ``split``'s accuracy) of every iteration that has both."""
    agree: dict[int, float] = {r["iteration"]: r["agreement"] for r in rows
                               if r["split"] == "train" and r["class"] == "all" and r.get("agreement") is not None}
    acc: dict[int, float] = {r["iteration"]: r["accuracy"] for r in rows
                             if r["split"] == split and r["class"] == "all" and r.get("accuracy") is not None}
    return sorted((n, a, acc[n]) for n, a in agree.items() if n in acc)


def collapse(rows: Sequence[dict], patience: int, split: str) -> dict[str, Any] | None:
    """The guard's finding on ``rows`` (``metrics.parquet``'s, so far): with ``patience`` P > 0,
    when the last P steps between consecutive iterations of ``_points`` each raised the agreement
    and lowered ``split``'s accuracy, those iterations and values; else None."""
    pts = _points(rows, split)
    if patience < 1 or len(pts) < patience + 1:
        return None
    last = pts[-(patience + 1):]
    if all(b[1] > a[1] and b[2] < a[2] for a, b in zip(last, last[1:])):
        return {"iterations": [p[0] for p in last], "agreement": [round(p[1], 4) for p in last],
                f"{split}_accuracy": [round(p[2], 4) for p in last]}
    return None


def collapse_stop(config: Any, rows: Sequence[dict], n: int) -> bool:
    """Whether the guard (``experiment.collapse_patience``) stops the run after iteration ``n``
    (``rows``: the run's metrics so far); a ``collapse_stop`` event says why."""
    found = collapse(rows, config.experiment.collapse_patience, config.evaluation.splits[0])
    if found is None or found["iterations"][-1] != n:
        return False
    log.warning("collapse_stop", iteration=n, patience=config.experiment.collapse_patience, **found,
                note="the training samples' agreement rose while the held-out accuracy fell: the run stops "
                     "(experiment.collapse_patience)")
    return True


def collapse_note(config: Any, rows: Sequence[dict]) -> str | None:
    """The run summary's line when the guard stopped the run at its last iteration."""
    found = collapse(rows, config.experiment.collapse_patience, config.evaluation.splits[0])
    last = max((r["iteration"] for r in rows), default=None)
    if found is None or found["iterations"][-1] != last:
        return None
    split = config.evaluation.splits[0]
    its = found["iterations"]
    return (f"collapse guard: stopped after iteration {last}: from iteration {its[0]} to {its[-1]} the training "
            f"samples' agreement rose ({' -> '.join(f'{a:.3f}' for a in found['agreement'])}) while {split} "
            f"accuracy fell ({' -> '.join(f'{a:.3f}' for a in found[f'{split}_accuracy'])}) "
            f"(experiment.collapse_patience = {config.experiment.collapse_patience})")
