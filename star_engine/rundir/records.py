"""One record type per Parquet table the core writes, and its Arrow schema derived from it.

A record is a frozen dataclass whose fields, in order, are the table's columns: a field's type
gives the column's Arrow type (``str``: string, ``int``: int64, ``Int32``: int32, ``bool``,
``float``: float64, ``tuple[str, ...]``: list of strings, ``tuple[R, ...]`` of a record type
``R``: list of structs of ``R``'s columns; ``X | None`` where a value may be null; every column
is nullable, as the files have always been written), and a field named differently in the file
(``class`` is a Python keyword: the field ``cls`` is the column ``class``) says so once, with
``column("class")``. ``schema`` derives the table's schema, ``table`` writes records and
``read`` reads them back (``row``: one record as {column: value}, the form the ledger and the
metrics rows keep for plugins); no other module declares a column. A column missing from a file
written by an older version reads as the field's default (``Evaluation.checker``,
``Evaluation.question``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar, Union
from collections.abc import Sequence

import pyarrow as pa

from ..api import Candidate, TrainExample
from ..errors import IntegrityError

Int32 = Annotated[int, pa.int32()]
"""An integer stored as int32 (``int`` alone: int64)."""

R = TypeVar("R")
MAX_ROWS = 50_000_000  # rows one record file holds: a stage's generations (runner), the readers' cap (export)
_ARROW = {str: pa.string(), int: pa.int64(), bool: pa.bool_(), float: pa.float64()}


def column(name: str, **kw: Any) -> Any:
    """A field stored under another column name (``cls: str = column("class")``)."""
    return field(metadata={"column": name}, **kw)


def _arrow(hint: Any) -> pa.DataType:
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return typing.get_args(hint)[1]
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _arrow(inner)
    if origin is tuple:
        return pa.list_(_arrow(typing.get_args(hint)[0]))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return pa.struct([(col, typ) for _, col, typ in _layout(hint)])
    return _ARROW[hint]


def _item(kind: type, f: dataclasses.Field) -> type | None:
    """The record type of the items of ``kind``'s field ``f`` (``tuple[R, ...]``), else None."""
    hint = typing.get_type_hints(kind)[f.name]
    args = typing.get_args(hint) if typing.get_origin(hint) is tuple else ()
    return args[0] if args and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]) else None


_LAYOUTS: dict[type, tuple[tuple[dataclasses.Field, str, pa.DataType], ...]] = {}  # _layout's, per record type


def _layout(kind: type) -> tuple[tuple[dataclasses.Field, str, pa.DataType], ...]:
    """(field, column name, Arrow type) of each of ``kind``'s fields, in order."""
    found = _LAYOUTS.get(kind)
    if found is None:
        hints = typing.get_type_hints(kind, include_extras=True)
        found = _LAYOUTS[kind] = tuple((f, f.metadata.get("column", f.name), _arrow(hints[f.name]))
                                       for f in dataclasses.fields(kind))
    return found


@functools.cache
def schema(kind: type, omit: tuple[str, ...] = ()) -> pa.Schema:
    """The Arrow schema of ``kind``'s table (without the columns ``omit``)."""
    return pa.schema([(col, typ) for _, col, typ in _layout(kind) if col not in omit])


def row(rec: Any, omit: tuple[str, ...] = ()) -> dict[str, Any]:
    """``rec`` as a row: {column: value} (a tuple as a list, a record in it as its row, as Arrow
    reads them back)."""
    return {col: [row(x) if dataclasses.is_dataclass(x) else x for x in v]
            if isinstance(v := getattr(rec, f.name), tuple) else v
            for f, col, _ in _layout(type(rec)) if col not in omit}


def table(recs: Sequence[Any], kind: type, omit: tuple[str, ...] = ()) -> pa.Table:
    """The records ``recs`` (of type ``kind``) as an Arrow table of ``schema(kind, omit)``."""
    return pa.Table.from_pylist([row(r, omit) for r in recs], schema=schema(kind, omit))


def read(t: pa.Table, kind: type[R], where: str = "") -> list[R]:
    """The rows of ``t`` as records of ``kind``; a column the file lacks takes the field's default
    (a file of an older version), and one without a default is an ``IntegrityError``."""
    values: dict[str, list[Any]] = {}
    for f, col, typ in _layout(kind):
        if col in t.column_names:
            values[f.name] = t.column(col).to_pylist()
            if pa.types.is_list(typ):
                item = _item(kind, f)
                values[f.name] = [tuple(v or ()) if item is None else tuple(_record(item, x) for x in v or ())
                                  for v in values[f.name]]
        elif f.default is not dataclasses.MISSING:
            values[f.name] = [f.default] * len(t)
        else:
            raise IntegrityError(f"{where}: unreadable {kind.__name__} table (no column '{col}')")
    return [kind(**dict(zip(values, vs))) for vs in zip(*values.values())]


def _record(kind: type[R], values: dict[str, Any]) -> R:
    """A struct read back ({column: value}) as a record of ``kind``."""
    return kind(**{f.name: values.get(col, f.default) for f, col, _ in _layout(kind)})


# ----------------------------------------------------------------------------- the tables


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One generation of a stage's chunk (``iterations/NNN/<stage>/chunk-NNNNN.parquet``)."""

    index: int  # position in the stage's list of prompts
    text: str
    # What produced it (``GenerationEngine.provenance``): the weights' content hash and the
    # server and model name; "" for the backend's own sampler (``model_checkpoint`` names its weights).
    model_version: str = ""
    sampled_by: str = ""


@dataclass(frozen=True, kw_only=True)
class Rationale:
    """A generated (or gold) rationale: ``generated.parquet``, ``rationalized.parquet`` (without
    ``kept`` and ``rejected_by``: ``UNSELECTED``) and ``rationales.parquet`` (the same rows with
    what was kept and what rejected the others) of an iteration. Filter
    plugins see it as the ``api.Candidate`` that ``candidate()`` returns."""

    question_id: str
    cls: str = column("class")
    iteration: Int32
    sample: Int32
    prompt: str  # stored (hint-free unless p_show_hint_save fired) context
    rationale: str  # generated text: rationale and answer
    predicted: str | None
    gold: str
    correct: bool
    was_hinted: bool
    kept: bool = False  # in the fine-tuning set
    rejected_by: str | None = None  # "checker" or the filter that dropped it
    checker: str
    model_checkpoint: str
    prompt_hash: str
    seed: int
    leak_strings: tuple[str, ...] = ()  # hint text that must not survive into `rationale`
    # The prompt was longer than the backend keeps (Backend.prompt_capacity) and lost its start;
    # null: not counted (a backend without prompt_capacity, gold rows, files written before).
    prompt_truncated: bool | None = None
    # Sampled through a generation engine (``generation.engine``): the hash of the weights the
    # server served and the server ("<url> <model name>"); "": the backend's own sampler.
    model_version: str = ""
    sampled_by: str = ""

    def candidate(self) -> Candidate:
        """The plugin contract's view of this row (``api.Candidate``: its fields, same names)."""
        return Candidate(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Candidate)})


@dataclass(frozen=True, kw_only=True)
class CheckerVerdict:
    """One ``[evaluation] checkers`` entry's verdict on an evaluation answer: an item of
    ``Evaluation.verdicts`` (a struct in the ``verdicts`` column)."""

    checker: str  # the entry's label (its name; with its options when a name is listed twice)
    predicted: str | None
    correct: bool | None  # null: not judged (the checker skips this question's gold answer)
    timed_out: bool = False  # the checker gave up at its time bound (then wrong)


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One answer to an evaluation question: ``eval_<split>.parquet`` (greedy: written without
    ``sample``) and ``eval_<split>_samples.parquet`` (``evaluation.samples_per_question`` each)."""

    question_id: str
    cls: str = column("class")
    iteration: Int32
    sample: Int32 | None = None  # sampled evaluation only
    split: str
    generation: str
    predicted: str | None
    gold: str
    correct: bool
    checker: str | None = None  # which checker judged (files written before it was recorded lack it)
    model_checkpoint: str
    prompt_hash: str
    verdicts: tuple[CheckerVerdict, ...] = ()  # the [evaluation] checkers', in their order (recorded only)
    prompt_truncated: bool | None = None  # as Rationale.prompt_truncated
    # The question as the task puts it to the model (Task.context: without the few-shot prompt);
    # null in files written before it was recorded.
    question: str | None = None
    model_version: str = ""  # as Rationale.model_version: the weights a generation engine served
    sampled_by: str = ""  # as Rationale.sampled_by


GREEDY = ("sample",)
"""The columns a greedy evaluation's file omits: ``table(rows, Evaluation, GREEDY)``."""

UNSELECTED = ("kept", "rejected_by")
"""The columns ``generated.parquet`` and ``rationalized.parquet`` omit: what is kept, and what
rejected it, is decided after them (the checker's ``correct`` and the filters,
``Stages.select``) and recorded in ``rationales.parquet`` alone; read back, they take the
fields' defaults."""


@dataclass(frozen=True, kw_only=True)
class Question:
    """A row of the per-question ledger, ``questions.parquet`` (``star_engine.rundir.ledger``)."""

    iteration: Int32  # the STaR iteration (1-based)
    question_id: str
    cls: str = column("class")
    samples: Int32  # rationales drawn without a hint
    correct: Int32  # ... of which the checker accepted
    hinted_samples: Int32  # rationales drawn with the answer as a hint (rationalization)
    hinted_correct: Int32  # ... of which the checker accepted
    solved: bool  # at least one correct rationale without a hint
    solved_with_hint: bool  # not solved, but a correct one with the hint
    kept: Int32  # rationales kept for fine-tuning (after the filters)
    distinct_correct: Int32  # distinct texts among the correct hint-free rationales
    tokens: int  # tokens generated for it (hint-free and hinted rationales)
    times_seen: Int32  # iterations it was drawn in, up to this one
    times_solved: Int32  # ... solved without a hint in
    first_solved: Int32 | None  # first iteration solved without a hint (null: not yet)
    last_solved: Int32 | None  # latest such iteration (null: not yet)


@dataclass(frozen=True, kw_only=True)
class CheckerAccuracy:
    """One ``[evaluation] checkers`` entry's accuracy on an evaluation split's greedy answers (of a
    class): an item of ``Metrics.checkers`` (a struct in the ``checkers`` column)."""

    checker: str  # as CheckerVerdict.checker
    accuracy: float | None  # correct / n (null when it judged none)
    n: int  # answers it judged
    correct: int
    timed_out: int  # ... of which it gave up on (counted wrong)
    skipped: int  # answers not judged (the checker skips their gold answer)


@dataclass(frozen=True, kw_only=True)
class VerifierScore:
    """The verifier's score of one sampled evaluation answer: ``iterations/NNN/verifier_<split>.parquet``
    (one row per row of ``eval_<split>_samples.parquet``). ``logp``: the log-probability the verifier
    gives the answer after its prompt; ``logp_reference``: the frozen reference's (the model the
    verifier started from); ``score``: what ranks the answers (``verifier.score``: "reward",
    DPO's implicit reward ``logp - logp_reference`` (beta omitted: the order is the same); or
    "likelihood", ``logp``)."""

    question_id: str
    cls: str = column("class")
    iteration: Int32
    sample: Int32
    split: str
    score: float
    logp: float
    logp_reference: float
    verifier_checkpoint: str
    reference_checkpoint: str


@dataclass(frozen=True, kw_only=True)
class FilterCount:
    """What one rationale filter rejected in an iteration (of a class): an item of
    ``Metrics.rejected`` (a struct in the ``rejected`` column)."""

    filter: str
    examples: int  # rationales it rejected
    questions: int  # questions with at least one rationale it rejected


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """A row of ``metrics.parquet``: one per iteration x split x class (null where a value does
    not apply)."""

    iteration: Int32
    split: str
    cls: str = column("class")
    accuracy: float | None
    n: int
    generated: int
    correct: int
    rationalized: int
    kept: int
    train_steps: int
    train_tokens: int
    train_loss: float | None
    wall_seconds: float
    coverage: float | None
    # Sampling (null where it does not apply). Eval splits: over evaluation.samples_per_question
    # samples per question; train: over the hint-free rationales (generation.samples_per_question).
    pass_k: int | None = None
    pass_at_k: float | None = None
    pass_at_1: float | None = None
    majority: float | None = None
    # Exploration and exploitation (train rows): distinct correct rationales per solved question,
    # the kept set's lengths in tokens.
    distinct_correct: float | None = None
    kept_len_mean: float | None = None
    kept_len_std: float | None = None
    # Eval rows: each [evaluation] checkers entry's accuracy, beside the task's checker's (`accuracy`).
    checkers: tuple[CheckerAccuracy, ...] = ()
    # Prompts longer than the backend keeps, left-truncated (Backend.prompt_capacity), among this
    # row's generations: train rows the generate stage's, `*_r` rows the rationalize stage's, eval
    # rows the greedy evaluation's; null where the backend does not say what it keeps.
    prompts_truncated: int | None = None
    # What the iteration fine-tuned on: "kept" (the rationales kept), "gold" (training.source =
    # "gold"), "gold_fallback" (--smoke: nothing was kept, the task's gold completions instead);
    # null when it did not train (iteration 0, or no steps).
    trained_on: str | None = None
    # Eval rows with a sampled evaluation: the first sample's accuracy (sample 0 of each question),
    # and with a [verifier], verifier@k: the verifier's top-ranked of k samples is right (unbiased
    # estimate from the samples, as pass@k; k = pass_k).
    first_sample: float | None = None
    verifier_at_k: float | None = None
    # Train rows: the temperature the iteration sampled at when generation.tuner chose it; the
    # questions whose hint-free samples were all right / all wrong (with more than one sample
    # per question); what each filter rejected.
    temperature: float | None = None
    groups_all_right: int | None = None
    groups_all_wrong: int | None = None
    rejected: tuple[FilterCount, ...] = ()
    # Train rows with more than one sample per question: the mean, over the questions, of the share
    # of a question's hint-free samples that give its most common answer (`predicted`; no answer
    # agrees with none): the self-agreement a label-free reward pays for (the collapse guard's).
    agreement: float | None = None


def training_examples(rows: Sequence[Rationale]) -> list[TrainExample]:
    return [TrainExample(r.prompt, r.rationale) for r in rows if r.kept]
