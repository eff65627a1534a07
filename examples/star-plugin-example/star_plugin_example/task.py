"""The ``unit_conversion`` task and its ``unit_answer`` hint formatter.

A question asks for a quantity in another unit of the same family::

    Q: How many centimetres are in 3.5 metres?
    A: 1 metre = 100 centimetres, so 3.5 x 100 = 350. The answer is 350 centimetres.

The first two lines up to ``A:`` are the context; the rest (with its final
newline, the stop string) is the completion. Data are generated from a seed, or
read from a JSONL file given as ``task.data.<split>``.
"""

from __future__ import annotations

import random
import re
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any

from star_engine import NON_EMPTY, Example, Fraction, NonNegInt, PosInt, TrainExample, UserError, between
from star_engine.helpers import read_jsonl

from . import units
from .units import PAIRS, UNITS, Unit, fmt, quantity

SPLITS = ("train", "dev", "test")
PROMPT_KINDS = ("rationale", "direct", "hint")
STOP = "\n"
_ANSWER = re.compile(r"answer is\s*:?\s*([^\n]*)", re.IGNORECASE)

Problem = tuple[Decimal, str, str]  # (quantity, from unit, to unit)


def question(value: Decimal, src: Unit, dst: Unit) -> str:
    return f"How many {dst.plural} are in {quantity(value, src)}?"


def context_text(q: str) -> str:
    return f"Q: {q}\nA:"


def answer_of(value: Decimal, src: Unit, dst: Unit) -> str:
    return quantity(units.convert(value, src, dst), dst)


def rationale(value: Decimal, src: Unit, dst: Unit) -> str:
    """The worked one-step rationale (without the final newline)."""
    result = units.convert(value, src, dst)
    if src.size >= dst.size:  # to a smaller unit: multiply
        k = units.factor(src, dst)
        step = f"1 {src.name} = {fmt(k)} {dst.plural}, so {fmt(value)} x {fmt(k)} = {fmt(result)}."
    else:
        k = units.factor(dst, src)
        step = f"{fmt(k)} {src.plural} = 1 {dst.name}, so {fmt(value)} / {fmt(k)} = {fmt(result)}."
    return f" {step} The answer is {quantity(result, dst)}."


def extract_answer(generation: str) -> str | None:
    """The text after the last "answer is" (to the end of its line), without a
    final period; None when the generation states no answer."""
    found = _ANSWER.findall(generation)
    if not found:
        return None
    text = found[-1].strip().rstrip(".!").strip()
    return text or None


class UnitConversionTask:
    """Options (all keyword, all checked):

    - ``seed``: generator seed; every generated split is a function of the options;
    - ``n_train``, ``n_dev``, ``n_test``: generated split sizes (dev and test are
      disjoint from each other and from train);
    - ``families``: unit families to ask about (default: all of length, mass,
      volume, time);
    - ``max_value``, ``decimals``: quantities are multiples of 10**-decimals in
      (0, max_value], on the side of the smaller unit's count or the bigger's;
    - ``n_seed``, ``seed_hint_fraction``: worked examples returned by
      ``seed_examples()`` (disjoint from dev and test), and the share of them
      repeated with the hint, so a model trained from scratch learns to read one;
    - ``n_shots``: worked examples in the few-shot prompts (0: no prompt).
    """

    default_checker = "unit_numeric"
    default_hint = "unit_answer"
    stop = (STOP,)

    def __init__(self, *, seed: NonNegInt = 0, n_train: PosInt = 1000, n_dev: PosInt = 100, n_test: PosInt = 100,
                 families: Annotated[list[str], NON_EMPTY] | None = None, max_value: PosInt = 20,
                 decimals: Annotated[int, between(0, 3)] = 1, n_seed: NonNegInt = 200,
                 seed_hint_fraction: Fraction = 0.5, n_shots: NonNegInt = 0) -> None:
        # The types and ranges above are checked by the core before this runs (declared once).
        self.seed = seed
        self.n = {"train": n_train, "dev": n_dev, "test": n_test}
        if families is None:
            families = list(units.FAMILIES)
        unknown = sorted(set(families) - set(units.FAMILIES))
        if unknown:
            raise UserError(f"families: unknown {', '.join(map(repr, unknown))}; known: {', '.join(units.FAMILIES)}")
        self.families = [f for f in units.FAMILIES if f in families]
        self.max_value, self.decimals = max_value, decimals
        self.n_seed, self.seed_hint_fraction, self.n_shots = n_seed, seed_hint_fraction, n_shots
        if self.n_shots > self.n_seed:
            raise UserError(f"n_shots: the few-shot examples come from the seed set; n_shots ({n_shots}) "
                            f"must be <= n_seed ({n_seed})")
        self.pairs = [p for p in PAIRS if UNITS[p[0]].family in self.families]
        capacity = 2 * len(self.pairs) * self.max_value * 10**self.decimals
        wanted = self.n["dev"] + self.n["test"] + max(self.n["train"], self.n_seed)
        if wanted > capacity // 2:
            raise UserError(f"n_train/n_dev/n_test/n_seed: {wanted} problems asked for, but only "
                            f"{capacity} exist for these families, max_value and decimals; "
                            f"ask for at most half of them")

    # ------------------------------------------------------------------ data

    def _draw(self, what: str, n: int, exclude: set[Problem]) -> list[Problem]:
        rng = random.Random(f"star-plugin-example/{self.seed}/{what}")  # str seeds: stable everywhere
        scale = 10**self.decimals
        out: list[Problem] = []
        seen = set(exclude)
        while len(out) < n:
            big, small = self.pairs[rng.randrange(len(self.pairs))]
            amount = Decimal(rng.randint(1, self.max_value * scale)) / scale
            if rng.random() < 0.5:  # "how many smaller units in <amount> bigger units"
                problem = (amount, big, small)
            else:  # "how many bigger units in <amount * factor> smaller units": the answer is amount
                problem = (amount * units.factor(UNITS[big], UNITS[small]), small, big)
            problem = (problem[0].normalize(), problem[1], problem[2])
            if problem not in seen:
                seen.add(problem)
                out.append(problem)
        return out

    @cached_property
    def _problems(self) -> dict[str, list[Problem]]:
        dev = self._draw("dev", self.n["dev"], set())
        test = self._draw("test", self.n["test"], set(dev))
        held = set(dev) | set(test)
        return {"dev": dev, "test": test, "train": self._draw("train", self.n["train"], held),
                "seed": self._draw("seed", self.n_seed, held)}

    def _example(self, id_: str, value: Decimal, src: Unit, dst: Unit) -> Example:
        return Example(id=id_, question=question(value, src, dst), answer=answer_of(value, src, dst),
                       cls=src.family, fields={"value": fmt(value), "from": src.name, "to": dst.name})

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is not None:
            return self._read_jsonl(split, path)
        if split not in SPLITS:
            raise UserError(f"unit_conversion: unknown split {split!r}; known: {', '.join(SPLITS)} "
                            f"(or give task.data.{split} = a JSONL file)")
        return [self._example(f"{fmt(v)}-{a}-to-{b}", v, UNITS[a], UNITS[b]) for v, a, b in self._problems[split]]

    def _read_jsonl(self, split: str, path: str) -> list[Example]:
        """Rows ``{"id"?, "quantity", "from", "to", "answer"?}``; units by any name or symbol.
        :func:`star_engine.read_jsonl` reports bad JSON as ``file:line``."""
        out = []
        for where, row in read_jsonl(path):
            for key in ("quantity", "from", "to"):
                if key not in row:
                    raise UserError(f"{where}: missing field {key!r}")
            value = units.parse_number(str(row["quantity"]))
            if value is None or value <= 0:
                raise UserError(f"{where}: quantity: expected a positive number, got {row['quantity']!r}")
            src, dst = (units.unit(str(row[k])) for k in ("from", "to"))
            for key, u in (("from", src), ("to", dst)):
                if u is None:
                    raise UserError(f"{where}: {key}: unknown unit {row[key]!r}; known: {', '.join(UNITS)}")
            if src.family != dst.family or src is dst:
                raise UserError(f"{where}: cannot ask for {dst.plural} in {src.plural}")
            line = where.rsplit(":", 1)[1]
            ex = self._example(str(row.get("id", f"{split}-{line}")), value.normalize(), src, dst)
            if "answer" in row and units.parse_quantity(str(row["answer"])) != units.parse_quantity(ex.answer):
                raise UserError(f"{where}: answer {row['answer']!r} disagrees with the conversion ({ex.answer})")
            out.append(ex)
        return out

    # ------------------------------------------------------------------ formats

    @staticmethod
    def _units(example: Example) -> tuple[Decimal, Unit, Unit]:
        f = example.fields
        return Decimal(f["value"]), UNITS[f["from"]], UNITS[f["to"]]

    def context(self, example: Example) -> str:
        return context_text(example.question)

    def prompt(self, kind: str) -> str:
        if kind not in PROMPT_KINDS:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        shots = []
        for value, a, b in self._problems["seed"][: self.n_shots]:
            src, dst = UNITS[a], UNITS[b]
            ctx = context_text(question(value, src, dst))
            if kind == "hint":
                ctx = hinted(ctx, answer_of(value, src, dst))
            body = f" The answer is {answer_of(value, src, dst)}." if kind == "direct" else rationale(value, src, dst)
            shots.append(ctx + body + STOP)
        return "".join(shots)

    def extract(self, generation: str) -> str | None:
        return extract_answer(generation)

    def gold_completion(self, example: Example, direct: bool) -> str:
        if direct:
            return f" The answer is {example.answer}.{STOP}"
        return rationale(*self._units(example)) + STOP

    def seed_examples(self) -> list[TrainExample]:
        seed = self._problems["seed"]
        out = []
        for value, a, b in seed:
            src, dst = UNITS[a], UNITS[b]
            out.append(TrainExample(context_text(question(value, src, dst)), rationale(value, src, dst) + STOP))
        for value, a, b in seed[: round(self.seed_hint_fraction * len(seed))]:
            src, dst = UNITS[a], UNITS[b]
            ctx = hinted(context_text(question(value, src, dst)), answer_of(value, src, dst))
            out.append(TrainExample(ctx, rationale(value, src, dst) + STOP))
        return out


HINT_CUE = "\nA:"


def hinted(ctx: str, answer: str, label: str = "answer") -> str:
    """``ctx`` with ``(answer: <gold>)`` after the question."""
    if not ctx.endswith(HINT_CUE):
        raise ValueError("the context does not end with a line 'A:'")
    return f"{ctx[: -len(HINT_CUE)]} ({label}: {answer}){HINT_CUE}"


class AnswerHint:
    """``unit_answer``: the gold answer in parentheses after the question.

    Option ``label`` (default "answer") is the word before the colon. The leak
    strings are the whole parenthesis and its opening ``(<label>:``.
    """

    def __init__(self, *, label: str = "answer") -> None:
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z][A-Za-z ]*", label):
            raise UserError(f"label: must be a word (letters and spaces), got {label!r}")
        self.label = label

    def context(self, task: Any, example: Example) -> str:
        try:
            return hinted(task.context(example), example.answer, self.label)
        except ValueError as e:
            raise UserError(f"unit_answer: example {example.id!r}: {e}") from None

    def leak_strings(self, task: Any, example: Example) -> tuple[str, ...]:
        return (f"({self.label}: {example.answer})", f"({self.label}:")
