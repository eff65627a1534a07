"""Optional capabilities: a component's optional methods, each a small protocol.

Each is documented with its component's protocol in :mod:`star_engine.api` and listed in
docs/CONTRACTS.md. The core asks ``isinstance(component, Trims)`` and calls the method only
then (an attribute set to None counts as absent; the answer is remembered per class, so a
class is not to gain or lose the method afterwards).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol, runtime_checkable

from pathlib import Path

from .api import Candidate, CheckContext, Progress, TrainExample, Verdict
from .jobs import GenSpec, PreferencePair, PreferenceSpec, TrainResult, TrainSpec


@runtime_checkable
class Trims(Protocol):  # a Task's (``Task``: trim)
    def trim(self, generation: str) -> str: ...


@runtime_checkable
class ChecksGold(Protocol):  # a Checker's (``Checker``: check_gold)
    def check_gold(self, gold: str) -> bool: ...


@runtime_checkable
class ValidatesRun(Protocol):  # a Backend's (``Backend.validate_run``)
    def validate_run(self, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None: ...


@runtime_checkable
class CountsTokens(Protocol):  # a Backend's (``Backend.count_tokens``); without it: UTF-8 bytes
    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...


@runtime_checkable
class CapsPrompts(Protocol):  # a Backend's (``Backend.prompt_capacity``); without it no prompt is cut
    def prompt_capacity(self, spec: GenSpec) -> int: ...


@runtime_checkable
class Starts(Protocol):  # a Backend's (``Backend.start``): the run starts its runtime, validate never
    def start(self) -> None: ...


@runtime_checkable
class MeasuresSpeed(Protocol):  # a Backend's (``Backend.matmul_gflops``): the run's time estimate and machine line
    def matmul_gflops(self) -> float: ...


@runtime_checkable
class RecordsCheckpoints(Protocol):  # a Backend's (``Backend.checkpoint_recorded``)
    def checkpoint_recorded(self, checkpoint: str) -> None: ...


@runtime_checkable
class Aborts(Protocol):  # a MultiProcess backend's (``MultiProcess``: abort)
    def abort(self, message: str) -> None: ...


@runtime_checkable
class ChecksInContext(Protocol):  # a Checker's (``Checker``: check_in)
    def check_in(self, context: CheckContext, generation: str, extracted: str | None, gold: str) -> Verdict: ...


@runtime_checkable
class ChecksGroups(Protocol):  # a Checker's (``Checker``: check_group, min_group): as ``task.reward`` only
    min_group: int

    def check_group(self, contexts: Sequence[CheckContext], generations: Sequence[str],
                    extracted: Sequence[str | None], gold: str) -> list[Verdict]: ...


@runtime_checkable
class ChecksMany(Protocol):  # a Checker's (``Checker``: check_many): a stage's generations at once
    def check_many(self, items: Sequence[tuple[str, str | None, str]]) -> list[Verdict]: ...


@runtime_checkable
class LabelFree(Protocol):  # a Checker's (``Checker.label_free``): True: its verdicts never read the gold answer
    label_free: bool


@runtime_checkable
class NeedsReferences(Protocol):  # a SamplingTuner's: True: its tuning reads ReferenceProbe.references
    needs_references: bool


@runtime_checkable
class TrainsVerifiers(Protocol):  # a Backend's (``Backend.train_preferences`` and ``score``): ``[verifier]``
    def train_preferences(self, init: str, out: Path, pairs: Sequence[PreferencePair], spec: PreferenceSpec,
                          progress: Progress | None = None) -> TrainResult: ...

    def score(self, checkpoint: str, examples: Sequence[TrainExample], batch_size: int,
              progress: Progress | None = None) -> list[float]: ...


@runtime_checkable
class SeesRejected(Protocol):  # a RationaleFilter's (``RationaleFilter``: keep_among)
    def keep_among(self, candidates: Sequence[Candidate], others: Sequence[Candidate],
                   history: Sequence[Candidate]) -> list[bool]: ...


@runtime_checkable
class DeclinesQuestions(Protocol):  # a RationaleFilter's (``RationaleFilter``: decline)
    """``decline(generated, history)``: of the iteration's hint-free samples ``generated`` (judged,
    right and wrong; before the checker's selection), the ids of the questions this filter takes
    out of the iteration: none of them is rationalized, and at selection every sample of them is
    rejected by it (``stages.Stages.declined``). Asked before rationalization and again at
    selection, so it must be deterministic, as ``keep``."""

    def decline(self, generated: Sequence[Candidate], history: Sequence[Candidate]) -> Collection[str]: ...


@runtime_checkable
class ValidatesEngine(Protocol):  # a GenerationEngine's (``GenerationEngine.validate``)
    """``validate(backend)``: what the engine needs of the run's backend (an export of its
    checkpoints the server loads, its tokenizer's prompt cut), checked before the run writes or
    starts anything; ``UserError`` naming the key otherwise."""

    def validate(self, backend: object) -> None: ...
