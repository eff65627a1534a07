"""The records of the plugin API: what the core hands a plugin (a split's ``Example``, a
filter's ``Candidate``, a checker's ``CheckContext``, a backend's ``TrainExample``) and what a
checker returns (``Verdict``); a task's ``DataFile``. ``star_engine.api`` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping


@dataclass(frozen=True)
class Example:
    """One question of a split.

    ``id`` is unique within the split and stable across runs. ``answer`` is the
    gold answer as the task's checker expects it ("" when the split has none,
    e.g. the CQA test split). ``cls`` is the class for per-class accuracy (a
    task without classes uses "all"). ``fields`` holds the task's own data
    (choices, the gold rationale, ...), JSON-serialisable.
    """

    id: str
    question: str
    answer: str
    cls: str = "all"
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataFile:
    """A file a task reads from the data root (``task.data_root``, ``STAR_ENGINE_DATA``) as its
    public release has it: a task factory lists them in its optional ``data_files`` attribute
    (``Task``), and ``star-engine data check`` compares the files there with them.

    ``path`` is relative to the data root, '/'-separated (``"gsm8k/train.jsonl"``); ``sha256``
    the hex digest of its bytes (None: the file has no one content, e.g. one a user makes with a
    script: only its presence is checked); ``source`` where it comes from (a URL, a release and
    version, a commit); ``license`` its licence."""

    path: str
    sha256: str | None
    source: str
    license: str


@dataclass(frozen=True)
class TrainExample:
    """A fine-tuning example: the loss is taken on ``completion`` only.

    ``completion`` already ends with whatever the task wants the model to emit
    last (the backend appends its own end-of-text token).
    """

    prompt: str
    completion: str


@dataclass(frozen=True)
class Candidate:
    """A generated rationale on its way to the training set, as a filter sees it: the fields of
    its row in ``rationales.parquet`` (``star_engine.rundir.records.Rationale``, whose ``candidate()``
    builds this view) that a filter reads."""

    question_id: str
    iteration: int
    sample: int
    prompt: str  # stored (hint-free unless p_show_hint_save fired) context
    rationale: str  # generated text: rationale and answer
    predicted: str | None
    gold: str
    correct: bool
    was_hinted: bool
    leak_strings: tuple[str, ...] = ()  # hint text that must not survive into `rationale`


@dataclass(frozen=True)
class Verdict:
    """A checker's judgement of one generation. ``timed_out``: the checker gave up on it at its
    own time bound (``correct`` is then False); the core counts these in the run's events
    (``checker_timeouts``) and, for the ``[evaluation] checkers``, in ``metrics.parquet``.
    ``score``: the checker's graded reward of the generation when it has one (a finite number,
    e.g. reasoning-gym's ``score_answer``, which ``correct`` thresholds), carried to a tuner's
    ``ProbeSample.score``; None (the default): the checker only says right or wrong."""

    predicted: str | None
    correct: bool
    timed_out: bool = False
    score: float | None = None


@dataclass(frozen=True)
class CheckContext:
    """Where a generation being judged comes from (``Checker.check_in``): the experiment's
    ``seed``, the STaR ``iteration`` (0: the base model's evaluation), the question, the sample
    (0 for a greedy answer) and the ``stage`` ("generate", "rationalize", "evaluate",
    "evaluate_sampled", "tune"); ``split`` is the split the question is from."""

    seed: int
    iteration: int
    question_id: str
    sample: int
    stage: str
    split: str
