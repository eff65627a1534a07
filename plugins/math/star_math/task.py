r"""The MATH task and its ``math_answer`` hint formatter.

Context: ``Problem:\n<problem>\n\nSolution:``. Rationale completion:
``\n<solution>\nFinal Answer: The final answer is $<answer>$. I hope it is correct.``; direct
completion: the closing sentence alone. Hinted context (``math_answer``): ``(Answer: $<answer>$)``
(or ``(Reference solution: <solution>)``) on its own line after the problem. Few-shot prompts are
examples separated by blank lines, with a trailing blank line.
"""

from __future__ import annotations

from typing import Annotated, Literal

from star_engine import NON_EMPTY, PROMPT_KINDS, Example, TrainExample, UserError
from star_engine.helpers import few_shot_prompts, prompt_files

from .answers import BOX_ONLY, extract, through_closing
from .data import Row, Subset, level_class, read_math, subject_class
from .known_files import DATA_FILES
from .prompts import add_hint, builtin, completion, hint_text, read_prompt_file
from .prompts import context as problem_context

FilePath = Annotated[str | None, NON_EMPTY]  # a file's path, or none


def _hinted(where: str, text: str, answer: str) -> str:
    try:
        return add_hint(text, hint_text(answer))
    except ValueError as e:  # only a user's prompt file can get here
        raise UserError(f"{where}: cannot add the hint to this prompt example: {e}") from None


class MATHTask:
    r"""MATH (Hendrycks et al. 2021) and MATH-500, JSONL. Options:

    - ``classes``: per-class accuracy by ``"subject"`` (default: ``algebra``,
      ``counting_and_probability``, ...), by ``"level"`` (``level_1`` .. ``level_5``,
      ``level_unknown`` for MATH's "Level ?") or ``"none"`` (one class, ``all``).
    - ``math500_file``: a MATH-500 JSONL file (``unique_id`` and ``problem`` per row). Split
      ``train`` then loses every MATH-500 problem; every other split keeps only them, each once,
      in its file's order, with the MATH-500 ``unique_id`` as its id, and must hold all of them.
      A problem is matched by ``unique_id``, else by its text (whitespace runs made one space).
      Default: none, each split is its file as it is.
    - ``extraction``: ``"lenient"`` (default, this project's: the closing sentence, else the last
      box), ``"boxed"`` (this project's: the last box only), ``"hendrycks"`` (exactly Hendrycks
      et al.'s ``last_boxed_only_string`` + ``remove_boxed``) or ``"minerva"`` (exactly
      lm-evaluation-harness ``minerva_math``), ``conventions.py``. Under the last two the gold
      answers are read from the solutions by the same convention; under the box-only ones a
      direct closing sentence boxes its answer; prompt files must state answers it reads.
    - ``stored_completion``: ``"final_answer"`` (default: the generation up to and including
      its first "I hope it is correct.") or ``"until_stop"`` (all of it).
    - ``prompts_file``, ``direct_prompts_file``: few-shot examples (default: 4 built in);
      ``hint_prompts_file``, ``direct_hint_prompts_file``: hinted ones (default: derived,
      ``(Answer: $X$)`` after each problem).
    - ``stop``: the stop strings (default ``["\nProblem:"]``).
    """

    data_files = DATA_FILES  # the released files it reads, with their sha256 (star-engine data check)
    default_checker = "math_verify"
    default_hint = "math_answer"

    def __init__(self, *, classes: Literal["subject", "level", "none"] = "subject", math500_file: FilePath = None,
                 extraction: Literal["lenient", "boxed", "hendrycks", "minerva"] = "lenient",
                 stored_completion: Literal["final_answer", "until_stop"] = "final_answer",
                 prompts_file: FilePath = None, hint_prompts_file: FilePath = None,
                 direct_prompts_file: FilePath = None, direct_hint_prompts_file: FilePath = None,
                 stop: list[str] | None = None) -> None:
        self.classes, self.math500_file = classes, math500_file
        self.extraction, self.stored_completion = extraction, stored_completion
        # A solution has blank lines: only a new problem ends a generation.
        self.stop = ("\nProblem:",) if stop is None else tuple(stop)
        if "" in self.stop:
            raise UserError(f"stop: must be a list of non-empty strings, got {stop!r}")
        files = prompt_files(prompts_file, hint_prompts_file, direct_prompts_file, direct_hint_prompts_file)
        boxed = extraction in BOX_ONLY
        self._prompts = few_shot_prompts(files, lambda path, kind: read_prompt_file(path, kind, extraction),
                                         lambda kind: builtin(kind, boxed), _hinted)
        self._subset: Subset | None = None

    # ------------------------------------------------------------------ data

    def _math500(self) -> Subset:
        if self._subset is None:
            assert self.math500_file is not None  # _select runs only with one
            self._subset = Subset.read(self.math500_file)
        return self._subset

    def _cls(self, row: Row) -> str:
        if self.classes == "subject":
            return subject_class(row.subject)
        return level_class(row.level) if self.classes == "level" else "all"

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            raise UserError(f"task.data.{split}: the math task reads its data from a file; set task.data.{split}",
                            key=f"task.data.{split}")
        _, rows = read_math(path, self.extraction)
        ids = [row.unique_id or f"{split}-{i}" for i, row in enumerate(rows)]
        if self.math500_file is not None:
            rows, ids = self._select(split, path, rows, ids)
        examples: list[Example] = []
        seen: dict[str, str] = {}
        for row, rid in zip(rows, ids):
            if rid in seen:
                raise UserError(f"{row.where}: duplicate unique_id {rid!r} (first at {seen[rid]})")
            seen[rid] = row.where
            examples.append(Example(id=rid, question=row.problem, answer=row.answer, cls=self._cls(row), fields={
                "solution": row.solution, "subject": row.subject, "level": row.level}))
        return examples

    def _select(self, split: str, path: str, rows: list[Row], ids: list[str]) -> tuple[list[Row], list[str]]:
        """``math500_file`` applied to a split (the class docstring)."""
        subset = self._math500()
        if split == "train":
            kept = [(row, rid) for row, rid in zip(rows, ids) if subset.index(row) is None]
            return [r for r, _ in kept], [i for _, i in kept]
        chosen: dict[int, int] = {}  # subset index -> row index; unique_id matches first
        for i, row in enumerate(rows):
            if row.unique_id is not None and row.unique_id in subset.by_id:
                chosen.setdefault(subset.by_id[row.unique_id], i)
        taken = set(chosen.values())
        for i, row in enumerate(rows):
            k = subset.index(row)
            if k is not None and i not in taken and k not in chosen:
                chosen[k] = i
                taken.add(i)
        missing = [uid for k, uid in enumerate(subset.ids) if k not in chosen]
        if missing:
            raise UserError(f"{path}: {len(missing)} of the {len(subset.ids)} problems of {subset.path} "
                            f"(task.options.math500_file) are not in this file, e.g. {missing[0]!r}; "
                            f"split '{split}' keeps only them")
        order = sorted(chosen, key=lambda k: chosen[k])
        return [rows[chosen[k]] for k in order], [subset.ids[k] for k in order]

    # ------------------------------------------------------------------ formats

    def context(self, example: Example) -> str:
        return problem_context(example.question)

    def prompt(self, kind: str) -> str:
        if kind not in self._prompts:
            raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(PROMPT_KINDS)}")
        return self._prompts[kind]

    def extract(self, generation: str) -> str | None:
        return extract(generation, self.extraction)

    def trim(self, generation: str) -> str:
        """What of a generation is checked and stored (``stored_completion``)."""
        return through_closing(generation) if self.stored_completion == "final_answer" else generation

    def gold_completion(self, example: Example, direct: bool) -> str:
        if not example.answer:
            raise UserError(f"math: example {example.id!r} has no gold answer")
        solution = None if direct else example.fields.get("solution")
        if not direct and not solution:
            raise UserError(f"math: example {example.id!r} has no gold solution")
        done = completion(solution, example.answer, direct and self.extraction in BOX_ONLY)
        cut = next((s for s in self.stop if s in done), None)
        if cut is not None:
            raise UserError(f"math: the gold completion of example {example.id!r} contains the stop string "
                            f"{cut!r} (task.options.stop), which would cut it short")
        return done

    def seed_examples(self) -> list[TrainExample]:
        return []


class AnswerHint:
    """``math_answer``: a hint on its own line after the problem. ``show = "answer"`` (default):
    ``(Answer: $<gold answer>$)``; ``show = "solution"``: ``(Reference solution: <the data set's
    whole solution>)``. Leak strings: the hint and its label."""

    def __init__(self, *, show: Literal["answer", "solution"] = "answer") -> None:
        self.show = show

    def text(self, example: Example) -> str:
        """The hint for ``example``."""
        if not example.answer:
            raise UserError(f"math_answer: example {example.id!r} has no gold answer to hint")
        if self.show == "answer":
            return hint_text(example.answer)
        solution = example.fields.get("solution")
        if not isinstance(solution, str) or not solution.strip():
            raise UserError(f"math_answer: example {example.id!r} has no solution to show (show = \"solution\")")
        return f"(Reference solution: {solution.strip()})"

    def context(self, task, example: Example) -> str:
        try:
            return add_hint(task.context(example), self.text(example))
        except ValueError as e:
            raise UserError(f"math_answer: example {example.id!r}: {e}") from None

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return (self.text(example), "(Answer:" if self.show == "answer" else "(Reference solution:")
