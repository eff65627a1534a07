"""The experiment configuration as typed, frozen objects, read by attribute.

Each section of an experiment file is a frozen dataclass whose fields carry their
schema (type, default, allowed range) as metadata: ``SCHEMA`` is derived from these
classes, so the TOML reference, the validation in :mod:`star_engine.config` and the
objects the core reads name the same keys. :func:`Config.from_dict` builds the objects
from a configuration ``config.load_experiment`` has validated and resolved; nothing is
checked twice. ``[model]`` and the component references (``task.checker``, ...) are
plugin option tables: they stay dicts, passed as keyword options to the factories. The
``[*.optimizer]`` tables are the backend's: it declares their typed section
(``Backend.optimizer_table``, made with :func:`setting`) and ``config.load_experiment``
checks and completes them by it, with the file's rules and messages.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields
from typing import Any
from collections.abc import Callable, Mapping

from .api import LOSSES, PACKINGS, TrainSpec

REQUIRED = object()
FREE = object()  # a table whose keys are options for a plugin (checked against its factory)


@dataclass(frozen=True)
class F:
    """One schema field: its type, default and allowed range."""

    type: str  # str | int | float | bool | strlist | component | components | table
    default: Any = REQUIRED
    check: Callable[[Any], bool] | None = None
    rule: str = ""  # what ``check`` demands, for the error message


def _rng(lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False
         ) -> tuple[Callable[[Any], bool], str]:
    def ok(v: Any) -> bool:
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    return ok, f"must be in {left}{lo}, {hi}{right}" if hi != math.inf else f"must be {'>' if lo_open else '>='} {lo}"


def setting(type_: str, default: Any = REQUIRED, lo: float | None = None, hi: float = math.inf,
            lo_open: bool = False, hi_open: bool = False, choices: tuple[str, ...] | None = None) -> Any:
    """A field of a typed section (a frozen dataclass deriving from ``Section``) whose schema
    is ``F(type_, default, ...)``: ``type_`` one of ``F.type``'s, ``default`` (``REQUIRED``:
    none), the allowed range ``lo``..``hi`` (each end closed unless ``*_open``) or ``choices``.
    The core's sections are made of these, and so are a plugin's own tables (a backend's
    optimizer table), checked by the same rules and messages (``config.check_table``)."""
    if choices is not None:
        spec = F(type_, default, lambda v: v in choices, f"must be one of {', '.join(choices)}")
    elif lo is None:
        spec = F(type_, default)
    else:
        spec = F(type_, default, *_rng(lo, hi, lo_open, hi_open))
    return field(metadata={"spec": spec})



def _table(spec: Any) -> Any:
    """A dataclass field holding a nested section (a dataclass) or a plugin table (``FREE``)."""
    return field(metadata={"spec": spec})


class Section:
    """What every section does: its schema, and itself built from / written as a plain dict."""

    @classmethod
    def schema(cls) -> dict[str, Any]:
        return {f.name: (f.metadata["spec"].schema() if _nested(f) else f.metadata["spec"]) for f in fields(cls)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        return cls(**{f.name: (f.metadata["spec"].from_dict(data[f.name]) if _nested(f) else _frozen(data[f.name]))
                      for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        """The section as the resolved configuration holds it (``config.json``)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _nested(f: Any) -> bool:
    return isinstance(f.metadata["spec"], type) and issubclass(f.metadata["spec"], Section)


def _frozen(value: Any) -> Any:
    return tuple(copy.deepcopy(value)) if isinstance(value, list) else copy.deepcopy(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class ExperimentSection(Section):
    name: str = setting("str")
    seed: int = setting("int", 0, 0)
    output_dir: str = setting("str", "")
    iterations: int = setting("int", REQUIRED, 1)
    early_stop_patience: int = setting("int", 0, 0)
    limit: int = setting("int", 0, 0)
    smoke: bool = setting("bool", False)  # --smoke: the tiny model, a few questions, every stage (config.smoke)


@dataclass(frozen=True)
class TaskSection(Section):
    dataset: str = setting("str")
    options: dict = setting("table", {})
    data_root: str = setting("str", "")  # the folder task.data and the task's file options are relative to
    data: dict = setting("table", {})
    checker: dict = setting("component", "")
    hint: dict = setting("component", "")
    filters: tuple = setting("components", [])
    direct: bool = setting("bool", False)
    few_shot_train: bool = setting("bool", False)


@dataclass(frozen=True)
class Generation(Section):
    max_new_tokens: int = setting("int", 96, 1)
    temperature: float = setting("float", 0.0, 0)
    top_p: float = setting("float", 1.0, 0, 1, lo_open=True)
    batch_size: int = setting("int", 8, 1)
    samples_per_question: int = setting("int", 1, 1)
    n_train_samples: int = setting("int", 0, 0)
    sampler: dict = setting("component", "")
    chunk_size: int = setting("int", 256, 1)


@dataclass(frozen=True)
class Rationalization(Section):
    enabled: bool = setting("bool", True)
    p_rationalization: float = setting("float", 1.0, 0, 1)
    p_show_hint_save: float = setting("float", 0.0, 0, 1)


@dataclass(frozen=True)
class Trains(Section):
    """What both training sections (``[base_training]``, ``[training]``) have: the shape of a
    step and its optimizer (the backend's table: ``config.load_experiment`` completes it with
    the backend's defaults); ``train_spec`` makes one fine-tuning job of it."""

    batch_size: int = setting("int", 8, 1)
    grad_accum: int = setting("int", 1, 1)
    packing: str = setting("str", "segments", choices=PACKINGS)
    loss: str = setting("str", "completion", choices=LOSSES)
    optimizer: dict = setting("table", {})
    adapter: dict = setting("table", {})  # {}: every weight trains; else e.g. { kind = "lora", rank = 16 }

    def train_spec(self, steps: int, seed: int) -> TrainSpec:
        """The backend's job; ``optimizer`` is the table (a dict), as the backend completed it;
        ``adapter`` None when the table is empty."""
        return TrainSpec(steps, self.batch_size, self.grad_accum, seed, copy.deepcopy(self.optimizer),
                         packing=self.packing, loss=self.loss,
                         adapter=copy.deepcopy(self.adapter) if self.adapter else None)


@dataclass(frozen=True)
class BaseTraining(Trains):
    steps: int = setting("int", 0, 0)


@dataclass(frozen=True)
class Training(Trains):
    schedule: dict = setting("component", {"name": "exponential_grow"})
    restart_from_base: bool = setting("bool", True)
    source: str = setting("str", "generated", choices=("generated", "gold"))


@dataclass(frozen=True)
class Evaluation(Section):
    splits: tuple = setting("strlist", ["dev"])
    no_prompt: bool = setting("bool", False)
    every: int = setting("int", 1, 1)
    at_start: bool = setting("bool", True)
    max_new_tokens: int = setting("int", 0, 0)
    temperature: float = setting("float", 0.0, 0)
    top_p: float = setting("float", 1.0, 0, 1, lo_open=True)
    samples_per_question: int = setting("int", 0, 0)
    sample_temperature: float = setting("float", 0.0, 0)
    pass_k: int = setting("int", 0, 0)
    checkers: tuple = setting("components", [])  # more verdicts, recorded beside task.checker's


@dataclass(frozen=True)
class Config(Section):
    """A whole experiment, validated and resolved (``samples_per_question``, ``pass_k`` and the
    task's default checker filled in); ``as_dict()`` is what ``config.json`` holds."""

    experiment: ExperimentSection = _table(ExperimentSection)
    task: TaskSection = _table(TaskSection)
    generation: Generation = _table(Generation)
    rationalization: Rationalization = _table(Rationalization)
    base_training: BaseTraining = _table(BaseTraining)
    training: Training = _table(Training)
    evaluation: Evaluation = _table(Evaluation)
    model: dict = _table(FREE)


SCHEMA: dict[str, Any] = Config.schema()
