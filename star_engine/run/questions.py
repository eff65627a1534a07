"""Which train questions a STaR iteration draws: ``generation.n_train_samples`` of them, chosen
by the ``generation.sampler`` plugin from the per-question ledger, or without one uniformly."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping, Sequence

from ..api import Example, QuestionSampler
from ..errors import PluginError
from ..config.registry import Registry
from ..seeds import derive_seed


def uniform_subset(questions: Sequence[Example], k: int, seed: int, iteration: int) -> list[str]:
    """The ids of ``k`` of ``questions`` drawn uniformly without replacement for ``iteration``
    (the ``k`` smallest seeds; all of them when ``k`` is not smaller)."""
    if k >= len(questions):
        return [q.id for q in questions]
    return [q.id for q in sorted(questions, key=lambda q: derive_seed(seed, iteration, q.id, "subset"))[:k]]


def draw(questions: Sequence[Example], k: int, sampler: QuestionSampler | None, name: str, iteration: int,
         ledger: Sequence[Mapping[str, Any]], seed: int, registry: Registry) -> list[Example]:
    """``k`` (at most) of ``questions`` for ``iteration``, in their order: ``sampler.select``'s
    choice from the ``ledger`` of the iterations before (checked), or ``uniform_subset``.
    ``registry`` built the sampler (a failure names its plugin)."""
    if sampler is None:
        ids = uniform_subset(questions, k, seed, iteration)
    else:
        rows = [dict(r) for r in ledger]
        with registry.calling(sampler, "select"):
            ids = sampler.select(iteration, questions, k, rows, seed)
        known = {q.id for q in questions}
        if not isinstance(ids, (list, tuple)) or not all(isinstance(i, str) and i in known for i in ids) \
                or len(set(ids)) != len(ids) or len(ids) > k:
            raise PluginError(f"generation.sampler: sampler '{name}'.select must return at most {k} distinct ids "
                              f"of train questions, got {str(ids)[:200]}", key='generation.sampler')
    chosen = set(ids)
    return [q for q in questions if q.id in chosen]
