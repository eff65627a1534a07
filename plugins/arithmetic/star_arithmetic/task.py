"""The ``addition`` task (STaR section 5) and its ``addition_target`` hint.

Data are generated, not read: ``load(split, None)`` for "train", "dev" and
"heldout" (digit counts outside the training range). The answer is the sum's
digits without spaces ("86"); ``cls`` is the digit count ("1".."5").
Formats are in :mod:`star_arithmetic.formats`.
"""

from __future__ import annotations

import random
from collections import Counter
from functools import cached_property
from typing import Annotated, Any

from star_engine import Example, NonNegInt, PosInt, TrainExample, UserError, at_least

from .formats import HINT, TERMINATOR, Style, direct_completion, extract_result, hint_line, hinted, problem
from .formats import context as problem_context
from .formats import rationale_completion
from .generate import NotEnough, Problem, draw, draw_equal, n_digits

MAX_DIGITS = 100  # operands' digit counts: a scratchpad line per digit; float()s of the numbers stay finite

SPLITS = ("train", "dev", "heldout")
PROMPT_KINDS = ("rationale", "direct", "hint")
DEV_FRACTION = 0.5
"""Dev takes equal shares of every digit count, and at most this share of a
count's problems, so that the tiny spaces (100 one-digit problems) keep half of
theirs for training and the seed set: 1-5 digits allow up to 250 dev questions."""


MAX_SEED_REPEAT = 1000
"""Bound on ``seed_repeats`` (the base training set is held in memory)."""


def _each_at_least(name: str, values: list[int], lo: int) -> list[int]:
    """``values`` (integers, as declared), each ``>= lo``."""
    for v in values:
        if v < lo:
            raise UserError(f"{name}: every count must be >= {lo}, got {v!r}")
    return list(values)


def _per_digit_count(name: str, values: list[Any], lo: int, hi: int, what: str) -> None:
    """A list giving one value per digit count from ``lo`` up: 1 to ``hi - lo + 1`` of them."""
    span = hi - lo + 1
    if not 1 <= len(values) <= span:
        raise UserError(f"{name}: must be a list of 1 to {span} {what} (digit counts {lo}..{hi}), got {values!r}")


class AdditionTask:
    """n-digit addition with a scratchpad. Options:

    - ``seed``: the generator seed (every split is a function of the options);
    - ``n_train``, ``n_dev``: problems of ``min_digits``..``max_digits`` digits
      (train and dev are disjoint); dev holds equal shares of every digit count
      (they differ by one when ``n_dev`` does not divide evenly), train spreads
      evenly and gives what a small count lacks to the larger ones;
    - ``heldout_digits``, ``n_heldout``: the "heldout" split's digit counts and size;
    - ``n_seed``, ``seed_max_digits``: the worked examples that train the base
      model (``min_digits``..``seed_max_digits`` digits, spread evenly, disjoint from dev);
    - ``seed_counts``: instead of those two, how many seed problems of each digit
      count from ``min_digits`` up (``[80, 400, 400, 20]``: a few long ones);
    - ``seed_repeats``: how many times each seed problem of a digit count (from
      ``min_digits`` up) appears in the base training set (``[20, 1]``: the 1-digit
      scratchpad, of which only 50 problems exist outside dev, seen 20 times as often);
      counts past the list's end repeat once;
    - ``seed_hint_fraction``: the share of those also given with the hint line,
      so that a model trained from scratch learns to read a hint (what a
      few-shot hint prompt does for a large model); a list gives one share per
      digit count from ``min_digits`` up (``[0.25, 0.25, 1.0]``: every 3-digit seed
      also with its hint), counts past the list's end taking its last share;
    - ``n_shots``: worked examples in the few-shot prompts (0: no prompt);
    - ``scratchpad``: ``"nye"`` (the paper's) or ``"columns"`` (each step line also
      writes the column's digits and their sum; ``formats.STYLES``).
    """

    default_checker = "exact"
    default_hint = "addition_target"
    stop = (TERMINATOR,)

    def __init__(self, *, seed: NonNegInt = 0, n_train: PosInt = 2000, n_dev: PosInt = 250, min_digits: PosInt = 1,
                 max_digits: PosInt = 5, heldout_digits: list[int] | None = None,
                 n_heldout: Annotated[int | None, at_least(1)] = None,
                 n_seed: Annotated[int | None, at_least(0)] = None,
                 seed_max_digits: Annotated[int | None, at_least(1)] = None,
                 seed_hint_fraction: float | list[float] = 0.5, n_shots: NonNegInt = 0,
                 seed_counts: list[int] | None = None, seed_repeats: list[int] | None = None,
                 scratchpad: Style = "nye") -> None:
        self.style = scratchpad
        # An option that would have no effect is an error naming both (n_seed is not silently ignored).
        for name, value in (("n_seed", n_seed), ("seed_max_digits", seed_max_digits)):
            if value is not None and seed_counts is not None:
                raise UserError(f"{name}: has no effect when seed_counts is set (seed_counts gives the seed problems "
                                f"of each digit count, and so their number and largest count); remove {name} or "
                                f"seed_counts")
        if n_heldout is not None and not heldout_digits:
            raise UserError("n_heldout: has no effect without heldout_digits (the 'heldout' split's digit counts); "
                            "set heldout_digits or remove n_heldout")
        if max_digits < min_digits:
            raise UserError(f"max_digits: must be >= min_digits ({min_digits}), got {max_digits}")
        if max_digits > MAX_DIGITS:
            raise UserError(f"max_digits: at most {MAX_DIGITS} digits, got {max_digits}")
        self.seed, self.min_digits, self.max_digits = seed, min_digits, max_digits
        self.n = {"train": n_train, "dev": n_dev, "heldout": 500 if n_heldout is None else n_heldout}
        self.heldout_digits = sorted(set(_each_at_least("heldout_digits", heldout_digits or [], 1)))
        if self.heldout_digits and self.heldout_digits[-1] > MAX_DIGITS:
            raise UserError(f"heldout_digits: at most {MAX_DIGITS} digits, got {self.heldout_digits[-1]}")
        for d in self.heldout_digits:
            if min_digits <= d <= max_digits:
                raise UserError(f"heldout_digits: {d} is inside the training range "
                                f"{min_digits}-{max_digits}; held-out counts must be outside it")
        self.seed_counts = None
        n_seed = 100 if n_seed is None else n_seed
        seed_max_digits = 2 if seed_max_digits is None else seed_max_digits
        if seed_counts is not None:
            _per_digit_count("seed_counts", seed_counts, min_digits, max_digits, "counts")
            self.seed_counts = _each_at_least("seed_counts", seed_counts, 0)
            n_seed, seed_max_digits = sum(self.seed_counts), min_digits + len(self.seed_counts) - 1
        if seed_repeats is not None:
            _per_digit_count("seed_repeats", seed_repeats, min_digits, max_digits, "repeat counts")
        self.seed_repeats = _each_at_least("seed_repeats", seed_repeats or [], 1)
        if self.seed_repeats and max(self.seed_repeats) > MAX_SEED_REPEAT:
            raise UserError(f"seed_repeats: at most {MAX_SEED_REPEAT} repeats, got {max(self.seed_repeats)}")
        if not min_digits <= seed_max_digits <= max_digits:
            raise UserError(f"seed_max_digits: must be in {min_digits}..{max_digits} (min_digits..max_digits), "
                            f"got {seed_max_digits}")
        self.n_seed, self.seed_max_digits = n_seed, seed_max_digits
        if isinstance(seed_hint_fraction, list):
            _per_digit_count("seed_hint_fraction", seed_hint_fraction, min_digits, max_digits, "shares")
        fractions = seed_hint_fraction if isinstance(seed_hint_fraction, list) else [seed_hint_fraction]
        if not all(0 <= f <= 1 for f in fractions):
            raise UserError(f"seed_hint_fraction: must be a number in [0, 1] or a list of them, "
                            f"got {seed_hint_fraction!r}")
        self.seed_hint_fraction = seed_hint_fraction
        self.n_shots = n_shots
        if n_shots > n_seed:
            raise UserError(f"n_shots: the few-shot examples come from the seed set; "
                            f"n_shots ({n_shots}) must be <= n_seed ({n_seed})")

    # ------------------------------------------------------------------ data

    def _rng(self, what: str) -> random.Random:
        # A string seed is hashed with SHA-512: the same across runs and machines.
        return random.Random(f"star-addition/{self.seed}/{what}")

    def _draw(self, what: str, option: str, digits: list[int], n: int, **kw: Any) -> list[Problem]:
        try:
            return draw(self._rng(what), digits, n, **kw)
        except NotEnough as e:
            raise UserError(f"task.options.{option}: {n} is too many: {e}", key=f"task.options.{option}") from None

    @cached_property
    def _problems(self) -> dict[str, list[Problem]]:
        digits = list(range(self.min_digits, self.max_digits + 1))
        try:
            dev = draw_equal(self._rng("dev"), digits, self.n["dev"], max_fraction=DEV_FRACTION)
        except NotEnough as e:
            raise UserError(f"task.options.n_dev: {self.n['dev']} is too many: {e}", key="task.options.n_dev") from None
        # Train and the seed set avoid dev (dev measures generalisation); the seed
        # set may overlap train: the base model has seen those problems either way.
        return {
            "dev": dev,
            "train": self._draw("train", "n_train", digits, self.n["train"], exclude=set(dev)),
            "seed": self._seed_problems(set(dev)),
        }

    def _seed_problems(self, dev: set[Problem]) -> list[Problem]:
        if not self.n_seed:
            return []
        if self.seed_counts is None:
            return self._draw("seed", "n_seed", list(range(self.min_digits, self.seed_max_digits + 1)),
                              self.n_seed, exclude=dev)
        rng, out = self._rng("seed"), []
        for d, k in enumerate(self.seed_counts, start=self.min_digits):
            try:
                out += draw(rng, [d], k, exclude=dev) if k else []
            except NotEnough as e:
                raise UserError(f"task.options.seed_counts: {k} problems of {d} digits is too many: {e}",
                                key="task.options.seed_counts") from None
        rng.shuffle(out)
        return out

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is not None:
            raise UserError(f"task.data.{split}: the addition task generates its data; remove this path",
                            key=f"task.data.{split}")
        if split not in SPLITS:
            raise UserError(f"addition: unknown split {split!r}; known: {', '.join(SPLITS)}")
        if split == "heldout":
            if not self.heldout_digits:
                raise UserError("addition: split 'heldout' is empty: set task.options.heldout_digits")
            problems = self._draw("heldout", "n_heldout", self.heldout_digits, self.n["heldout"])
        else:
            problems = self._problems[split]
        return [Example(id=f"{a}+{b}", question=problem(a, b), answer=str(a + b),
                        cls=str(n_digits((a, b))), fields={"a": a, "b": b}) for a, b in problems]

    # ------------------------------------------------------------------ formats

    def context(self, example: Example) -> str:
        return problem_context(example.fields["a"], example.fields["b"])

    def prompt(self, kind: str) -> str:
        if kind not in PROMPT_KINDS:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        shots = []
        for a, b in self._problems["seed"][: self.n_shots]:
            ctx = problem_context(a, b)
            if kind == "hint":
                ctx = hinted(ctx, str(a + b))
            done = direct_completion(a, b) if kind == "direct" else self._worked(a, b)
            shots.append(ctx + done)  # each completion ends with the blank-line terminator
        return "".join(shots)

    def _worked(self, a: int, b: int) -> str:
        return rationale_completion(a, b, self.style)

    def extract(self, generation: str) -> str | None:
        return extract_result(generation)

    def gold_completion(self, example: Example, direct: bool) -> str:
        a, b = example.fields["a"], example.fields["b"]
        return direct_completion(a, b) if direct else self._worked(a, b)

    def seed_examples(self) -> list[TrainExample]:
        seed = self._problems["seed"]
        plain = [(p, TrainExample(problem_context(*p), self._worked(*p))) for p in seed]
        with_hint = [(p, TrainExample(hinted(problem_context(*p), str(sum(p))), self._worked(*p)))
                     for p in self._hinted_seeds(seed)]
        return [ex for p, ex in plain + with_hint for _ in range(self._repeats(p))]

    def _hinted_seeds(self, seed: list[Problem]) -> list[Problem]:
        """The seed problems also given with their hint: the first ``fraction * len(seed)``
        of the (shuffled) seed list, or with one share per digit count, the first
        ``share * count`` of each count's problems in list order."""
        if not isinstance(self.seed_hint_fraction, list):
            return seed[:round(self.seed_hint_fraction * len(seed))]
        shares = self.seed_hint_fraction
        count = Counter(n_digits(p) for p in seed)
        quota = {d: round(shares[min(d - self.min_digits, len(shares) - 1)] * k) for d, k in count.items()}
        out = []
        for p in seed:
            if quota[n_digits(p)] > 0:
                quota[n_digits(p)] -= 1
                out.append(p)
        return out

    def _repeats(self, p: Problem) -> int:
        i = n_digits(p) - self.min_digits
        return self.seed_repeats[i] if i < len(self.seed_repeats) else 1


class TargetHint:
    """``addition_target``: the target result on a ``Hint:`` line before ``Target:``."""

    def context(self, task, example: Example) -> str:
        try:
            return hinted(task.context(example), example.answer)
        except ValueError as e:
            raise UserError(f"addition_target: example {example.id!r}: {e}") from None

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return (hint_line(example.answer), HINT.strip())
