r"""Reading MATH files: Hendrycks et al.'s rows and the MATH-500 layout, checked row by row
with errors that say ``file:line: reason``.

- Hendrycks MATH (one JSON object per line, as the release's per-problem files):
  ``{"problem", "solution", "level": "Level 3", "type": "Algebra"}``, optionally
  ``"unique_id"``. The gold answer is the last ``\boxed{}`` of the solution.
- MATH-500 (HuggingFaceH4/MATH-500 ``test.jsonl``; PRM800K's ``math_splits``):
  ``{"problem", "solution", "answer", "subject", "level": 3, "unique_id"}``. The gold answer
  is ``answer``.

Under ``extraction = "hendrycks"`` or ``"minerva"`` the gold answer of either layout is that
convention's reading of the solution (``conventions.hendrycks_gold``, ``minerva_gold``), as its
released evaluation takes it; a solution it reads no answer from is refused.

A file's layout is its first row's: MATH-500 when that row has ``answer`` or ``subject``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from star_engine import UserError
from star_engine.helpers import get, read_jsonl

from .answers import UnclosedBox, last_boxed
from .conventions import hendrycks_gold, minerva_gold

MAX_BYTES = 1 << 30  # a MATH file larger than this is refused before it is read (all of MATH: ~10 MB)
MAX_LINES = 1_000_000  # lines, counted before any is parsed (all of MATH: 12,500)
_LEVEL = re.compile(r"Level\s+(\d{1,4}|\?)")


@dataclass(frozen=True)
class Row:
    """One problem as read: ``where`` is ``file:line``; ``level`` None for "Level ?"."""

    where: str
    problem: str
    solution: str
    answer: str
    subject: str
    level: int | None
    unique_id: str | None


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The non-blank lines of a JSONL file as ``("file:line", object)``
    (``star_engine.config.datafiles.read_jsonl``), with the file's size and number of lines checked
    against ``MAX_BYTES`` and ``MAX_LINES`` before anything is parsed."""
    return read_jsonl(path, max_bytes=MAX_BYTES, max_lines=MAX_LINES)


def _boxed(solution: str, where: str) -> str | None:
    try:
        return last_boxed(solution)
    except UnclosedBox as e:
        raise UserError(f"{where}: field 'solution': {e}") from None


SOLUTION_GOLD = {"hendrycks": hendrycks_gold, "minerva": minerva_gold}
"""The extractions whose gold answer is read from the solution by the released evaluation's functions."""


def _convention_gold(solution: str, where: str, extraction: str) -> str:
    try:
        return SOLUTION_GOLD[extraction](solution)
    except ValueError as e:
        raise UserError(f"{where}: field 'solution': {e} (task.options.extraction = {extraction!r})") from None


def _hendrycks(where: str, obj: dict[str, Any], extraction: str) -> Row:
    problem = get(obj, "problem", str, where)
    solution = get(obj, "solution", str, where)
    level_text = get(obj, "level", str, where)
    subject = get(obj, "type", str, where).strip()
    m = _LEVEL.fullmatch(level_text.strip())
    if m is None:
        raise UserError(f"{where}: field 'level' must be 'Level <n>' or 'Level ?', got {level_text[:40]!r}")
    if extraction in SOLUTION_GOLD:
        answer: str | None = _convention_gold(solution, where, extraction)
    else:
        answer = _boxed(solution, where)
    if answer is None:
        raise UserError(f"{where}: field 'solution' has no \\boxed{{...}} answer (or only an empty one) "
                        f"to take the gold answer from")
    unique_id = get(obj, "unique_id", str, where, required=False)
    return Row(where, problem.strip(), solution.strip(), answer, subject,
               None if m.group(1) == "?" else int(m.group(1)), unique_id)


def _math500(where: str, obj: dict[str, Any], extraction: str) -> Row:
    problem = get(obj, "problem", str, where)
    solution = get(obj, "solution", str, where)
    answer = get(obj, "answer", str, where).strip()
    subject = get(obj, "subject", str, where).strip()
    level = get(obj, "level", int, where, nonempty=False)
    if level < 1:
        raise UserError(f"{where}: field 'level' must be an integer >= 1, got {level}")
    unique_id = get(obj, "unique_id", str, where)
    if extraction in SOLUTION_GOLD:  # as lm-eval's minerva_math500: the solution's box, not 'answer'
        answer = _convention_gold(solution, where, extraction)
    else:
        _boxed(solution, where)  # a box in the solution must close, though the answer is 'answer'
    return Row(where, problem.strip(), solution.strip(), answer, subject, level, unique_id)


def read_math(path: str | Path, extraction: str = "lenient") -> tuple[str, list[Row]]:
    """The layout (``"hendrycks"`` or ``"math500"``) and the rows of a MATH file, gold answers
    read as ``extraction`` (``task.options.extraction``) takes them."""
    rows = read_rows(path)
    layout = "math500" if {"answer", "subject"} & set(rows[0][1]) else "hendrycks"
    parse = _math500 if layout == "math500" else _hendrycks
    return layout, [parse(where, obj, extraction) for where, obj in rows]


def subject_class(subject: str) -> str:
    """``"Counting & Probability"`` -> ``"counting_and_probability"``."""
    slug = re.sub(r"[^0-9a-z]+", "_", subject.lower().replace("&", " and ")).strip("_")
    return slug or "unknown"


def level_class(level: int | None) -> str:
    return "level_unknown" if level is None else f"level_{level}"


def problem_key(problem: str) -> str:
    """A problem's text with runs of whitespace made one space: what matches it across files."""
    return " ".join(problem.split())


@dataclass(frozen=True)
class Subset:
    """The problems of a MATH-500 file (``math500_file``), in its order."""

    path: str
    ids: tuple[str, ...]
    by_id: dict[str, int]
    by_problem: dict[str, int]

    @classmethod
    def read(cls, path: str) -> Subset:
        ids: list[str] = []
        by_id: dict[str, int] = {}
        by_problem: dict[str, int] = {}
        for where, obj in read_rows(path):
            uid = get(obj, "unique_id", str, where)
            key = problem_key(get(obj, "problem", str, where))
            if uid in by_id:
                raise UserError(f"{where}: duplicate unique_id {uid!r}")
            by_id[uid] = len(ids)
            by_problem.setdefault(key, len(ids))
            ids.append(uid)
        return cls(path, tuple(ids), by_id, by_problem)

    def index(self, row: Row) -> int | None:
        """Which of the subset's problems ``row`` is (by ``unique_id``, else by its text)."""
        if row.unique_id is not None and row.unique_id in self.by_id:
            return self.by_id[row.unique_id]
        return self.by_problem.get(problem_key(row.problem))
