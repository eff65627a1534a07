"""The ``code_expr`` task: write the Python expression of a list function shown by two examples,
checked by running it on the shown inputs and on three hidden ones (the ``python_tests`` checker).
Generated, like the ``addition`` task, and small enough for a byte-level model trained from scratch
on a CPU::

    # f([3, 1, 2]) == [4, 2, 3]
    # f([5, 0, 7, 1]) == [6, 1, 8, 2]
    f = lambda x: [v + 1 for v in x]

The first three lines up to ``lambda x:`` are the context, `` [v + 1 for v in x]\\n`` the completion
(``"\\n"`` is the stop string). ``cls`` is the function's family: map, order, reduce, slice.
"""

from __future__ import annotations

import random
from typing import Annotated

from star_engine import Example, NonNegInt, PosInt, TrainExample, UserError, at_least

from .checker import gold_answer

CUE = "f = lambda x:"
FUNCTIONS: tuple[tuple[str, str], ...] = (
    *(("map", f"[v + {k} for v in x]") for k in range(1, 6)),
    *(("map", f"[v * {k} for v in x]") for k in (2, 3)),
    ("order", "sorted(x)"), ("order", "sorted(x, reverse=True)"), ("order", "x[::-1]"),
    ("reduce", "sum(x)"), ("reduce", "max(x)"), ("reduce", "min(x)"), ("reduce", "len(x)"),
    *(("slice", f"x[:{k}]") for k in (1, 2, 3)), *(("slice", f"x[{k}:]") for k in (1, 2)),
)
SPLITS = ("train", "dev")


def _apply(expr: str, xs: list[int]) -> object:
    return eval(f"lambda x: {expr}")(list(xs))  # noqa: S307 - our own expressions, never a generation's


class CodeExprTask:
    """``code_expr``. Options: ``seed``; ``n_train``, ``n_dev`` (disjoint questions); ``n_seed``: worked
    examples for ``[base_training]`` (disjoint from dev), each repeated ``seed_repeats`` times."""

    default_checker = "python_tests"
    default_hint = "code_tests"
    stop = ("\n",)

    def __init__(self, *, seed: NonNegInt = 0, n_train: PosInt = 2000, n_dev: PosInt = 200, n_seed: NonNegInt = 300,
                 seed_repeats: Annotated[int, at_least(1)] = 1) -> None:
        if seed_repeats > 1000:
            raise UserError(f"seed_repeats: at most 1000, got {seed_repeats}")
        if n_train + n_dev + n_seed > 200_000:
            raise UserError(f"n_train: n_train + n_dev + n_seed must be at most 200000, got {n_train + n_dev + n_seed}")
        self.seed, self.n = seed, {"train": n_train, "dev": n_dev, "seed": n_seed}
        self.seed_repeats = seed_repeats
        self._made: dict[str, list[Example]] | None = None

    def _question(self, rng: random.Random) -> Example:
        cls, expr = rng.choice(FUNCTIONS)
        shown = [[rng.randrange(10) for _ in range(rng.randint(3, 5))] for _ in range(2)]
        hidden = [[rng.randrange(10) for _ in range(rng.randint(3, 6))] for _ in range(3)]
        question = "".join(f"# f({xs}) == {_apply(expr, xs)}\n" for xs in shown)
        tests = "\n".join(f"assert f({xs}) == {_apply(expr, xs)!r}" for xs in shown + hidden)
        return Example(id=question.replace("\n", " ").strip(), question=question, answer=gold_answer(CUE, tests),
                       cls=cls, fields={"expression": expr})

    def _examples(self) -> dict[str, list[Example]]:
        if self._made is None:
            rng, made, seen = random.Random(f"star-code-expr/{self.seed}"), {}, set()
            for split in ("dev", "train", "seed"):  # dev first: train and the seed set avoid it
                out: list[Example] = []
                while len(out) < self.n[split]:
                    ex = self._question(rng)
                    if ex.id not in seen:
                        seen.add(ex.id)
                        out.append(ex)
                made[split] = out
            self._made = made
        return self._made

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is not None:
            raise UserError(f"task.data.{split}: the code_expr task generates its data; remove this path",
                            key=f"task.data.{split}")
        if split not in SPLITS:
            raise UserError(f"code_expr: unknown split {split!r}; known: {', '.join(SPLITS)}")
        return list(self._examples()[split])

    def context(self, example: Example) -> str:
        return example.question + CUE

    def prompt(self, kind: str) -> str:
        return ""

    def extract(self, generation: str) -> str | None:
        return generation if generation.strip() else None

    def gold_completion(self, example: Example, direct: bool) -> str:
        return f" {example.fields['expression']}\n"

    def seed_examples(self) -> list[TrainExample]:
        return [TrainExample(self.context(ex), self.gold_completion(ex, False))
                for ex in self._examples()["seed"] for _ in range(self.seed_repeats)]
