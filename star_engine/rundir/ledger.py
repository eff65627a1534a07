"""The per-question ledger: what happened to each train question in each iteration it was drawn.

``iterations/NNN/questions.parquet`` holds iteration NNN's rows and ``questions.parquet`` (in
the run directory) every iteration's, both written, checksummed and resumed like every other
artifact. One row per (iteration, question drawn in it); the ``times_*``, ``first_solved`` and
``last_solved`` columns carry the question's history up to and including that iteration, so the
latest row of a question says all that happened to it so far (what question samplers read).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from collections.abc import Callable, Mapping, Sequence

from ..api import Example
from .records import Question, Rationale, row, schema

LEDGER_SCHEMA = schema(Question)  # its columns: star_engine.rundir.records.Question


def latest(ledger: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The latest ledger row of every question seen so far (its history up to then)."""
    out: dict[str, Mapping[str, Any]] = {}
    for r in ledger:
        prev = out.get(r["question_id"])
        if prev is None or r["iteration"] >= prev["iteration"]:
            out[r["question_id"]] = r
    return out


def ledger_rows(n: int, questions: Sequence[Example], rationales: Sequence[Rationale],
                before: Sequence[Mapping[str, Any]], count_tokens: Callable[[Sequence[str]], list[int]]) -> list[dict]:
    """Iteration ``n``'s rows: one per question drawn (``questions``, in their order), from the
    iteration's candidates (``rationales.parquet``: every rationale, kept or not) and the rows
    of the iterations ``before``. Gold rows (``training.source = "gold"``) count as kept only."""
    by_q: dict[str, list[Rationale]] = defaultdict(list)
    for r in rationales:
        by_q[r.question_id].append(r)
    tokens = dict(zip(map(id, rationales), count_tokens([r.rationale for r in rationales])))
    history = latest(before)
    rows = []
    for ex in questions:
        rs = by_q.get(ex.id, [])
        drawn = [r for r in rs if r.checker != "gold"]
        plain = [r for r in drawn if not r.was_hinted]
        hinted = [r for r in drawn if r.was_hinted]
        right = [r for r in plain if r.correct]
        solved = bool(right)
        h = history.get(ex.id, {})
        times_solved = (h.get("times_solved") or 0) + solved
        first = h.get("first_solved")
        rows.append(row(Question(
            iteration=n, question_id=ex.id, cls=ex.cls, samples=len(plain), correct=len(right),
            hinted_samples=len(hinted), hinted_correct=sum(r.correct for r in hinted),
            solved=solved, solved_with_hint=not solved and any(r.correct for r in hinted),
            kept=sum(r.kept for r in rs), distinct_correct=len({r.rationale for r in right}),
            tokens=sum(tokens[id(r)] for r in drawn), times_seen=(h.get("times_seen") or 0) + 1,
            times_solved=times_solved, first_solved=first if first is not None else (n if solved else None),
            last_solved=n if solved else h.get("last_solved"))))
    return rows


def summary(ledger: Sequence[Mapping[str, Any]], n_train: int) -> dict[str, Any]:
    """Coverage and the questions never solved, or solved only with a hint, over the whole run."""
    seen: dict[str, dict[str, bool]] = {}
    for r in ledger:
        s = seen.setdefault(r["question_id"], {"solved": False, "hint": False})
        s["solved"] |= bool(r["solved"])
        s["hint"] |= bool(r["solved_with_hint"])
    only_hint = sorted(q for q, s in seen.items() if s["hint"] and not s["solved"])
    never = sorted(q for q, s in seen.items() if not s["hint"] and not s["solved"])
    solved = sum(s["solved"] for s in seen.values())
    return {"seen": len(seen), "solved": solved, "coverage": solved / n_train if n_train else 0.0,
            "only_with_hint": only_hint, "never_solved": never}
