"""``star-engine show RUN_DIR``: what the model wrote, as a table in the terminal or as rows for a
program (``--format jsonl`` or ``csv``, every column): each rationale of the train split
(``iterations/NNN/rationales.parquet``: its verdict, kept or rejected and by what) and each answer
to an evaluation split (``eval_<split>.parquet``, greedy, and ``eval_<split>_samples.parquet``,
sampled). Reads only, never locks: a running run shows what it has recorded so far (an iteration
whose selection has not run yet: its ``generated.parquet`` and ``rationalized.parquet``, kept
not decided yet, null).

A row is ``SHOWN`` then the record's other columns (``columns``): ``question`` is, for a
rationale, its stored prompt (the hint-free ``Task.context``, after the few-shot prompt when
``task.few_shot_train`` stored it), for an evaluation answer its ``question`` column (null in files
written before it was recorded); ``text`` is the rationale (``rationale``) or the answer
(``generation``) as the task keeps it; ``split`` is ``task.train_split`` for the rationales;
``kind`` is ``rationale``, ``rationalized`` (generated with the hint), ``gold`` (a gold
completion, ``training.source = "gold"``), ``greedy`` or ``sampled``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Sequence

from ..errors import IntegrityError, UserError
from ..rundir.records import Evaluation, Question, Rationale, read, row, schema
from .status import Run, iterations_present, open_run
from ..rundir.store import check_regular

SHOWN = ("iteration", "split", "kind", "question_id", "class", "sample", "question", "text", "predicted", "gold",
         "correct", "kept", "rejected_by")
RENAMED = ("prompt", "rationale", "generation")  # shown as `question` and `text`
FORMATS = ("table", "jsonl", "csv")
QUESTION_TAIL = 300  # characters of a long question the table shows (its end: the question itself)


def columns() -> tuple[str, ...]:
    """Every column of a row, in order: ``SHOWN``, then the rationales' and the evaluation
    answers' other columns."""
    rest = [c for k in (Rationale, Evaluation) for c in schema(k).names if c not in SHOWN and c not in RENAMED]
    return SHOWN + tuple(dict.fromkeys(rest))


@dataclass(frozen=True)
class Filters:
    """``show``'s filters; None / False: not filtered."""

    iteration: int | None = None
    split: str | None = None
    wrong: bool = False
    rationalized: bool = False
    cls: str | None = None
    question: str | None = None
    grep: str | None = None
    limit: int | None = None


def _read(run: Run, rel: str, kind: type) -> list[Any]:
    path = run.root / rel
    check_regular(path, "Parquet file")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return read(pq.read_table(path), kind, str(path))
    except (pa.ArrowException, OSError, TypeError) as e:
        raise IntegrityError(f"{path}: unreadable Parquet file ({e})") from None


def _rationale_row(r: Rationale, split: str, decided: bool) -> dict[str, Any]:
    kind = "gold" if r.checker == "gold" else "rationalized" if r.was_hinted else "rationale"
    out = {"iteration": r.iteration, "split": split, "kind": kind, "question_id": r.question_id, "class": r.cls,
           "sample": r.sample, "question": r.prompt, "text": r.rationale, "predicted": r.predicted, "gold": r.gold,
           "correct": r.correct, "kept": r.kept if decided else None, "rejected_by": r.rejected_by}
    return _rest(out, row(r))


def _answer_row(e: Evaluation, sampled: bool) -> dict[str, Any]:
    out = {"iteration": e.iteration, "split": e.split, "kind": "sampled" if sampled else "greedy",
           "question_id": e.question_id, "class": e.cls, "sample": e.sample, "question": e.question,
           "text": e.generation, "predicted": e.predicted, "gold": e.gold, "correct": e.correct, "kept": None,
           "rejected_by": None}
    return _rest(out, row(e))


def _rest(out: dict[str, Any], full: dict[str, Any]) -> dict[str, Any]:
    return {**{c: None for c in columns()}, **out,
            **{c: v for c, v in full.items() if c not in out and c not in RENAMED}}


def train_split(run: Run) -> str:
    return str(run.config.get("task", {}).get("train_split") or "train")


def eval_splits(run: Run) -> list[str]:
    return [str(s) for s in run.config.get("evaluation", {}).get("splits", [])]


def load(run: Run, iteration: int | None, split: str | None) -> list[dict[str, Any]]:
    """The rows of the iteration(s) and split(s) asked for, in order: by iteration, the
    rationales, then each evaluation split's greedy and sampled answers."""
    arts, train = run.artifacts, train_split(run)
    out: list[dict[str, Any]] = []
    for n in iterations_present(arts):
        if iteration is not None and n != iteration:
            continue
        d = f"iterations/{n:03d}"
        if split in (None, train):
            if f"{d}/rationales.parquet" in arts:
                out += [_rationale_row(r, train, True) for r in _read(run, f"{d}/rationales.parquet", Rationale)]
            else:  # selection not run yet: the stages' files, nothing kept or rejected yet
                for name in ("generated", "rationalized"):
                    if f"{d}/{name}.parquet" in arts:
                        out += [_rationale_row(r, train, False) for r in _read(run, f"{d}/{name}.parquet", Rationale)]
        for s in eval_splits(run):
            if split not in (None, s):
                continue
            for rel, sampled in ((f"{d}/eval_{s}.parquet", False), (f"{d}/eval_{s}_samples.parquet", True)):
                if rel in arts:
                    out += [_answer_row(e, sampled) for e in _read(run, rel, Evaluation)]
    return out


def _check(run: Run, f: Filters) -> None:
    """Filters that name what the run does not have: one line naming it (``UserError``)."""
    if f.iteration is not None:
        have = iterations_present(run.artifacts)
        if f.iteration not in have:
            held = f"it has {_ranges(have)}" if have else "it has none recorded yet"
            raise UserError(f"--iteration {f.iteration}: no such iteration in {run.root} ({held})")
    splits = list(dict.fromkeys([train_split(run), *eval_splits(run)]))
    if f.split is not None and f.split not in splits:
        raise UserError(f"--split {f.split}: no such split in {run.root} (it has {', '.join(splits)}: "
                        f"{train_split(run)} the rationales, the others evaluation answers)")
    if f.limit is not None and f.limit < 1:
        raise UserError(f"--limit {f.limit}: must be >= 1")


def _ranges(ns: Sequence[int]) -> str:
    return f"iteration {ns[0]}" if len(ns) == 1 else f"iterations {ns[0]}-{ns[-1]}" \
        if list(ns) == list(range(ns[0], ns[-1] + 1)) else "iterations " + ", ".join(map(str, ns))


def select(run: Run, f: Filters) -> tuple[list[dict[str, Any]], int]:
    """The rows the filters keep (at most ``f.limit``) and how many matched."""
    _check(run, f)
    pattern = None
    if f.grep is not None:
        try:
            pattern = re.compile(f.grep)
        except re.error as e:
            raise UserError(f"--grep {f.grep!r}: not a regular expression ({e})") from None
    rows = load(run, f.iteration, f.split)
    if f.cls is not None and rows and f.cls not in {r["class"] for r in rows}:
        have = ", ".join(sorted({r["class"] for r in rows}))
        raise UserError(f"--class {f.cls}: no such class among the rows of {run.root} (classes: {have})")
    if f.question is not None and f.question not in {r["question_id"] for r in rows} \
            and not history(run, f.question):
        raise UserError(f"--question {f.question}: no such question among the rows of {run.root}")
    rows = [r for r in rows
            if (not f.rationalized or r["kind"] == "rationalized")
            and (not f.wrong or not r["correct"])
            and (f.cls is None or r["class"] == f.cls)
            and (f.question is None or r["question_id"] == f.question)
            and (pattern is None or any(pattern.search(r[c] or "") for c in ("question", "text", "predicted")))]
    return rows[:f.limit] if f.limit else rows, len(rows)


def history(run: Run, question_id: str) -> list[Question]:
    """The question's rows of the ledger (``questions.parquet``), by iteration."""
    if "questions.parquet" not in run.artifacts:
        return []
    return sorted((q for q in _read(run, "questions.parquet", Question) if q.question_id == question_id),
                  key=lambda q: q.iteration)


# ----------------------------------------------------------------------------- output


def _cell(v: Any) -> Any:
    return json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else "" if v is None else v


def write_jsonl(rows: Sequence[dict[str, Any]]) -> None:
    for r in rows:
        sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def write_csv(rows: Sequence[dict[str, Any]]) -> None:
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(columns())
    for r in rows:
        w.writerow([_cell(r[c]) for c in columns()])
    sys.stdout.flush()


def _kept(r: dict[str, Any]) -> str:
    if r["kind"] in ("greedy", "sampled"):
        return ""
    if r["kept"] is None:
        return "not selected yet"
    return "kept" if r["kept"] else f"rejected: {r['rejected_by'] or '?'}"


def _table_rows(rows: Sequence[dict[str, Any]]) -> Iterator[tuple[str, ...]]:
    for r in rows:
        q = r["question"]
        q = "–" if q is None else q if len(q) <= QUESTION_TAIL else "…" + q[-QUESTION_TAIL:]
        kind = r["kind"] + ("" if r["sample"] is None else f" #{r['sample']}")
        yield (str(r["iteration"]), r["split"], kind, r["question_id"], q, r["text"], r["predicted"] or "–",
               r["gold"], "right" if r["correct"] else "wrong", _kept(r))


def _console() -> Any:
    from rich.console import Console

    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:  # a file or a pipe: wide, cells folded
        out = Console(width=160)
    return out


def print_table(run: Run, rows: Sequence[dict[str, Any]], matched: int, f: Filters) -> None:
    from rich.table import Table
    from rich.text import Text

    out = _console()
    if not rows:
        print(f"{run.root}: no rationale or answer matches")
    else:
        shown = f"{len(rows)} of {matched} rows (--limit)" if matched > len(rows) else f"{matched} rows"
        print(f"{run.root}: {shown}")
        table = Table(show_lines=True)
        for name in ("it", "split", "kind", "id", "question", "model wrote", "predicted", "gold", "verdict",
                     "kept"):
            table.add_column(name, overflow="fold", ratio=3 if name in ("question", "model wrote") else None)
        for cells in _table_rows(rows):
            table.add_row(*(Text(c) for c in cells))  # model text is no markup
        out.print(table)
    if f.question is not None:
        past = history(run, f.question)
        if not past:
            print(f"question {f.question}: no row in questions.parquet (not a train question, or not drawn yet)")
            return
        print(f"question {f.question} across iterations (questions.parquet):")
        table = Table()
        cols = ("iteration", "samples", "correct", "hinted_samples", "hinted_correct", "kept", "solved",
                "solved_with_hint", "times_seen", "times_solved", "first_solved")
        for c in cols:
            table.add_column(c.replace("_", " "), justify="right")
        for q in past:
            table.add_row(*(Text("–" if (v := getattr(q, c)) is None else str(v)) for c in cols))
        out.print(table)


def command(root: Path, f: Filters, fmt: str = "table") -> int:
    """``star-engine show RUN_DIR``."""
    run = open_run(root)
    rows, matched = select(run, f)
    if fmt == "jsonl":
        write_jsonl(rows)
    elif fmt == "csv":
        write_csv(rows)
    else:
        print_table(run, rows, matched, f)
    return 0
