"""Question samplers: which train questions STaR iteration ``n`` draws (``generation.sampler``).

Each class is a factory whose keyword-only ``__init__`` parameters declare its TOML options
(types and ranges, checked by the registry before it is built);
``select(iteration, questions, n, ledger, seed)`` returns the ids of at most ``n`` questions.
Every random choice comes from ``derive_seed(seed, iteration, question id, purpose)``, so a
choice depends neither on the split's order nor on where a run was interrupted.

- ``uniform``: ``n`` questions drawn uniformly without replacement (what
  ``generation.n_train_samples`` has always drawn).
- ``adaptive``: the idea of AdaSTaR (2025): questions solved rarely, or long ago, are
  drawn first. Weighted sampling without replacement (Efraimidis and Spirakis 2006).
- ``curriculum``: classes in order (e.g. digit counts); the next class opens when every
  class before it was solved at least ``threshold`` of the time the last time it was drawn.
- ``stratified``: every class (e.g. digit count) gets an equal share of the ``n`` draws; a
  class holding fewer questions gives all of them and its remainder to the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from star_engine import Example, Fraction, NonNegFloat, UserError, between
from star_engine.helpers import derive_seed, latest, natural, uniform_subset


def _uniform(u: int) -> float:
    """A 31-bit seed as a number in (0, 1)."""
    return (u + 0.5) / 0x80000000


class UniformSampler:
    """Every question equally likely, a new draw each iteration: the core's own rule when no
    sampler is set (``star_engine.run.questions.uniform_subset``)."""

    def __init__(self) -> None:
        pass

    def select(self, iteration: int, questions: Sequence[Example], n: int, ledger: Sequence[Mapping[str, Any]],
               seed: int) -> list[str]:
        return uniform_subset(questions, n, seed, iteration)


class AdaptiveSampler:
    """A question's weight is ``floor + (1 - floor) * age / (1 + times_solved) ** power``:
    ``times_solved`` counts the iterations it was solved without a hint in (ledger), ``age`` is
    1 for a question never solved (drawn or not) and ``(iteration - last_solved) / iteration``
    for one solved before. ``floor`` keeps every question drawable; ``power`` 0 ignores how
    often a question was solved. ``n`` questions are drawn without replacement, each with
    a chance in proportion to its weight (Efraimidis-Spirakis keys ``u ** (1 / weight)``)."""

    def __init__(self, *, floor: Annotated[float, between(0, 1, lo_open=True)] = 0.1,
                 power: NonNegFloat = 1.0) -> None:
        self.floor, self.power = floor, power

    def weight(self, iteration: int, history: Mapping[str, Any] | None) -> float:
        solved = (history or {}).get("times_solved") or 0
        last = (history or {}).get("last_solved")
        age = 1.0 if last is None else (iteration - last) / iteration
        return self.floor + (1 - self.floor) * age / (1 + solved) ** self.power

    def select(self, iteration: int, questions: Sequence[Example], n: int, ledger: Sequence[Mapping[str, Any]],
               seed: int) -> list[str]:
        if n >= len(questions):
            return [q.id for q in questions]
        history = latest(ledger)

        def key(q: Example) -> float:  # log(u) / w: the largest n keys are the draw
            return math.log(_uniform(derive_seed(seed, iteration, q.id, "adaptive"))) / \
                self.weight(iteration, history.get(q.id))

        return [q.id for q in sorted(questions, key=key, reverse=True)[:n]]


class CurriculumSampler:
    """Classes in ``order`` (default: the split's classes, numbers in numeric order; classes not
    listed follow in that order). The first class is open; each next one opens when every
    class before it reached ``threshold``: the share of its questions solved without a hint,
    in the latest iteration that drew it (a class never drawn has 0). ``n`` questions are
    drawn uniformly from the open classes (fewer when they hold fewer)."""

    def __init__(self, *, order: list[str] | None = None, threshold: Fraction = 0.5) -> None:
        self.order = [] if order is None else list(order)
        if "" in self.order:
            raise UserError(f"order: must be a list of non-empty strings, got {order!r}")
        self.threshold = threshold

    def classes(self, questions: Sequence[Example]) -> list[str]:
        present = {q.cls for q in questions}
        listed = [c for c in dict.fromkeys(self.order) if c in present]
        return listed + sorted(present - set(listed), key=natural)

    @staticmethod
    def accuracy(ledger: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Per class: the share solved without a hint in the latest iteration that drew it."""
        last: dict[str, int] = {}
        for r in ledger:
            last[r["class"]] = max(last.get(r["class"], 0), r["iteration"])
        tally: dict[str, list[int]] = {c: [0, 0] for c in last}
        for r in ledger:
            if r["iteration"] == last[r["class"]]:
                tally[r["class"]][0] += bool(r["solved"])
                tally[r["class"]][1] += 1
        return {c: s / t for c, (s, t) in tally.items()}

    def open_classes(self, questions: Sequence[Example], ledger: Sequence[Mapping[str, Any]]) -> list[str]:
        acc = self.accuracy(ledger)
        out = []
        for c in self.classes(questions):
            out.append(c)
            if acc.get(c, 0.0) < self.threshold:
                break
        return out

    def select(self, iteration: int, questions: Sequence[Example], n: int, ledger: Sequence[Mapping[str, Any]],
               seed: int) -> list[str]:
        open_ = set(self.open_classes(questions, ledger))
        return uniform_subset([q for q in questions if q.cls in open_], n, seed, iteration)


class StratifiedSampler:
    """Equal shares per class, drawn uniformly within each class. A class holding fewer questions
    than its share gives all of them, and what it could not take is spread over the larger
    classes (so ``n`` questions are drawn whenever the split holds ``n``). Shares are filled from
    the smallest class up; ties in size go in ``natural`` order of the class names. Use it when
    the train split's classes are unbalanced (100 one-digit addition problems against thousands
    of every longer count) and every class should stay in the fine-tuning set."""

    def __init__(self) -> None:
        pass

    @staticmethod
    def shares(sizes: Mapping[str, int], n: int) -> dict[str, int]:
        """How many questions each class gives: at most its size, equal otherwise (shares of
        the classes that can give them differ by at most one), ``min(n, total)`` in all."""
        order = sorted(sizes, key=lambda c: (sizes[c], natural(c)))
        out, left = {}, min(n, sum(sizes.values()))
        for i, c in enumerate(order):
            share = -(-left // (len(order) - i))  # ceil: what is left over the classes not yet served
            out[c] = min(share, sizes[c])
            left -= out[c]
        return out

    def select(self, iteration: int, questions: Sequence[Example], n: int, ledger: Sequence[Mapping[str, Any]],
               seed: int) -> list[str]:
        by_class: dict[str, list[Example]] = {}
        for q in questions:
            by_class.setdefault(q.cls, []).append(q)
        shares = self.shares({c: len(qs) for c, qs in by_class.items()}, n)
        return [i for c, qs in by_class.items() for i in uniform_subset(qs, shares[c], seed, iteration)]
