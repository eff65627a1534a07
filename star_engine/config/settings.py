"""The sections of an experiment file as typed, frozen objects, read by attribute (the whole
experiment, ``config.Config``, holds one of each).

Each section of an experiment file is a frozen dataclass whose fields are its keys, each
declared once with its type, default and allowed range (``star_engine.config.schema``): the TOML
reference, the validation in :mod:`star_engine.config.load` (``schema.validate``) and the
objects the core reads name the same keys. ``Config.from_dict`` builds the objects
from a configuration ``config.load_experiment`` has validated and resolved; nothing is
checked twice. A section makes the jobs it describes: ``Generation.gen_spec`` and
``EvaluationSection.gen_spec`` the backend's generation specs, ``Trains.train_spec`` its
training jobs. ``[model]`` and the component references (``task.checker``, ...) are
plugin option tables: they stay dicts, checked against the factory they name by the same
validator (``Registry.create``). The ``[*.optimizer]`` tables are the backend's: it
declares their typed section (``Backend.optimizer_table``, a dataclass like these) and
``config.load_experiment`` checks and completes them by it.
"""

from __future__ import annotations

import copy
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Literal

from ..jobs import GenSpec, Loss, Packing, PreferenceSpec, TrainSpec
from ..errors import UserError
from .schema import (NON_EMPTY, Component, Components, Fraction, NonNegFloat, NonNegInt, PosInt, above, between,
                     declared)


class Section:
    """What every section does: its options, and itself built from / written as a plain dict."""

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """Its options by key (``schema.Option``); a nested section's: that section's schema."""
        out: dict[str, Any] = {}
        for name, opt in declared(cls).items():
            sub = _section_type(cls, name)
            out[name] = sub.schema() if sub is not None else opt
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        return cls(**{f.name: (sub.from_dict(data[f.name]) if (sub := _section_type(cls, f.name)) else
                               _frozen(data[f.name])) for f in fields(cls)})  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        """The section as the resolved configuration holds it (``config.json``)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    # Until release 0.2, a section also reads as the table it was (``load_experiment`` returned
    # dicts, a job's ``optimizer`` was one): ``section["key"]``, ``.get``, ``.keys``, with a warning.
    def __getitem__(self, key: str) -> Any:
        _read_as_table(self, key)
        return self.as_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        _read_as_table(self, key)
        return self.as_dict().get(key, default)

    def keys(self) -> Any:
        _read_as_table(self, "keys()")
        return self.as_dict().keys()


def _read_as_table(section: Section, key: str) -> None:
    name = type(section).__name__
    warnings.warn(f"{name} read as a table ({key!r}): read its attributes ({name} is the typed object the core "
                  f"hands on; as_dict() gives the table); reading it as a table goes in release 0.2",
                  DeprecationWarning, stacklevel=3)


def _section_type(cls: type, name: str) -> type[Section] | None:
    """The nested section a field holds, if it holds one."""
    t = typing.get_type_hints(cls).get(name)
    return t if isinstance(t, type) and issubclass(t, Section) else None


def _frozen(value: Any) -> Any:
    return tuple(copy.deepcopy(value)) if isinstance(value, list) else copy.deepcopy(value)


def _handed(table: Any) -> Any:
    """What a job carries of a backend's table: its frozen object as is, a plain table copied."""
    return table if isinstance(table, Section) else copy.deepcopy(table)


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class ExperimentSection(Section):
    name: Annotated[str, NON_EMPTY]  # the run's folder runs/<name> beside the experiment file when output_dir is not set
    # output_dir: relative to the experiment file's folder, as every path in an experiment (docs/configuration.md)
    seed: NonNegInt = 0
    output_dir: str = ""
    iterations: PosInt
    early_stop_patience: NonNegInt = 0
    # the collapse guard (star_engine.run.labelfree): stop when, over the last N evaluated iterations, the
    # training samples' agreement rose at each while the first evaluation split's accuracy fell; 0 = off
    collapse_patience: NonNegInt = 0
    stop_when_nothing_kept: bool = False  # an iteration that keeps nothing (a nothing_kept warning) ends the run
    limit: NonNegInt = 0
    smoke: bool = False  # --smoke: the tiny model, a few questions, every stage (config.smoke)
    # the whole run's wall time measured on a CPU whose fp32 matmuls reach expected_gflops: the run measures
    # this machine's figure at start (Backend.matmul_gflops) and prints its estimate; 0 = none (both or neither)
    expected_minutes: NonNegFloat = 0.0
    expected_gflops: NonNegFloat = 0.0


@dataclass(frozen=True, kw_only=True)
class TaskSection(Section):
    dataset: str
    options: dict = field(default_factory=dict)
    data_root: str = ""  # the folder task.data and the task's file options are relative to
    data: dict = field(default_factory=dict)
    # the split the iterations draw their questions from (test-time training: an evaluated split)
    train_split: Annotated[str, NON_EMPTY] = "train"
    checker: Component = ""
    reward: Component = ""  # what decides which training samples are right (default: the checker)
    hint: Component = ""
    filters: Components = field(default_factory=list)
    direct: bool = False
    few_shot_train: bool = False


Probability = Annotated[float, between(0, 1, lo_open=True)]


@dataclass(frozen=True, kw_only=True)
class Sampling(Section):
    """The sampling options ``[generation]`` and ``[evaluation]`` both declare, once: the
    temperature (0: greedy) and the nucleus of the answers they ask for."""

    temperature: NonNegFloat = 0.0
    top_p: Probability = 1.0


@dataclass(frozen=True, kw_only=True)
class Generation(Sampling):
    max_new_tokens: PosInt = 96
    batch_size: PosInt = 8
    samples_per_question: PosInt = 1
    n_train_samples: NonNegInt = 0
    sampler: Component = ""
    tuner: Component = ""  # chooses each iteration's temperature (SamplingTuner); "": generation.temperature
    chunk_size: PosInt = 256
    # What samples: "" the backend's own sampler; else a registered engine (register_engines,
    # e.g. "server": an OpenAI-compatible inference server) with [generation.server] its options.
    engine: str = ""
    server: dict = field(default_factory=dict)

    def gen_spec(self, stop: tuple[str, ...]) -> GenSpec:
        """How rationales are sampled (generation, rationalization); ``stop``: the task's."""
        return GenSpec(self.max_new_tokens, self.temperature, self.top_p, stop, self.batch_size)


@dataclass(frozen=True, kw_only=True)
class Rationalization(Section):
    enabled: bool = True
    p_rationalization: Fraction = 1.0
    p_show_hint_save: Fraction = 0.0


@dataclass(frozen=True, kw_only=True)
class Trains(Section):
    """What both training sections (``[base_training]``, ``[training]``) have: the shape of a
    step and its optimizer (the backend's table: ``config.load_experiment`` completes it with
    the backend's defaults); ``train_spec`` makes one fine-tuning job of it."""

    batch_size: PosInt = 8
    grad_accum: PosInt = 1
    packing: Packing = "segments"
    loss: Loss = "completion"
    # the TOML table; once loaded, the backend's object (its ``optimizer_table``, ``load._backend_tables``)
    optimizer: dict = field(default_factory=dict)
    adapter: dict = field(default_factory=dict)  # {}: every weight trains; else e.g. { kind = "lora", rank = 16 }

    def train_spec(self, steps: int, seed: int) -> TrainSpec:
        """The backend's job: ``optimizer`` the backend's object; ``adapter`` None when the table is
        empty."""
        return TrainSpec(steps, self.batch_size, self.grad_accum, seed, _handed(self.optimizer),
                         packing=self.packing, loss=self.loss,
                         adapter=_handed(self.adapter) if self.adapter else None)


@dataclass(frozen=True, kw_only=True)
class BaseTraining(Trains):
    steps: NonNegInt = 0


@dataclass(frozen=True, kw_only=True)
class Training(Trains):
    schedule: Component = field(default_factory=lambda: {"name": "exponential_grow"})
    restart_from_base: bool = True
    source: Literal["generated", "gold"] = "generated"


@dataclass(frozen=True, kw_only=True)
class EvaluationSection(Sampling):
    splits: list[str] = field(default_factory=lambda: ["dev"])
    no_prompt: bool = False
    every: PosInt = 1
    at_start: bool = True
    max_new_tokens: NonNegInt = 0
    samples_per_question: NonNegInt = 0
    sample_temperature: NonNegFloat = 0.0
    pass_k: NonNegInt = 0
    checkers: Components = field(default_factory=list)  # more verdicts, recorded beside task.checker's

    @staticmethod
    def resolve_inherited(ev: dict[str, Any], g: dict[str, Any]) -> None:
        """The one place the evaluation's values that 0 hands to ``[generation]`` are resolved:
        written into the configuration as it is loaded (``config.json`` records them) for the
        sampled evaluation (pass@k, majority vote): ``samples_per_question`` 0 follows
        ``[generation]`` (its samples when it samples at a temperature, else 1: greedy only),
        ``sample_temperature`` 0 is the generation's, ``pass_k`` 0 is ``samples_per_question``;
        and when the specs are made (``gen_spec``): ``max_new_tokens`` 0 is the generation's."""
        if ev["samples_per_question"] == 0:
            ev["samples_per_question"] = g["samples_per_question"] if g["temperature"] > 0 else 1
        n = ev["samples_per_question"]
        if ev["sample_temperature"] == 0:
            ev["sample_temperature"] = g["temperature"]
        if n > 1 and ev["sample_temperature"] == 0:
            raise UserError(f"evaluation.sample_temperature: must be > 0 when evaluation.samples_per_question is "
                            f"{n} (and generation.temperature is 0)", key="evaluation.sample_temperature")
        if ev["pass_k"] > n:
            raise UserError(f"evaluation.pass_k: {ev['pass_k']} is more than evaluation.samples_per_question ({n})",
                            key="evaluation.pass_k")
        ev["pass_k"] = ev["pass_k"] or n

    def gen_spec(self, generation: Generation, stop: tuple[str, ...]) -> GenSpec:
        """How the evaluation answers (greedy, at ``temperature``); ``max_new_tokens`` 0 and the
        batch are ``[generation]``'s; ``stop``: the task's."""
        return GenSpec(self.max_new_tokens or generation.max_new_tokens, self.temperature, self.top_p, stop,
                       generation.batch_size)

    def sampled_spec(self, generation: Generation, stop: tuple[str, ...]) -> GenSpec:
        """How the sampled evaluation (``samples_per_question`` > 1) answers: at
        ``sample_temperature``, with ``[generation]``'s ``top_p``."""
        greedy = self.gen_spec(generation, stop)
        return GenSpec(greedy.max_new_tokens, self.sample_temperature, generation.top_p, stop, greedy.batch_size)


@dataclass(frozen=True, kw_only=True)
class Verifier(Section):
    """``[verifier]``: V-STaR (Hosseini et al. 2024, Algorithm 1): a verifier trained by DPO on
    D_VER, the correct and incorrect solutions the run has sampled (and the task's gold solutions),
    which ranks the sampled evaluation's answers (verifier@k). ``schedule``: when and on what
    (``star_engine.run.verifying``; docs/successors.md says which option is the paper's)."""

    enabled: bool = False
    # "final": one verifier after the last iteration on D_VER of every iteration (Algorithm 1);
    # "cumulative": at each evaluating iteration t, on D_VER up to t (the paper's per-iteration curves);
    # "each_iteration": at each evaluating iteration n, on iteration n's pairs alone (this project's earlier rule)
    schedule: Literal["final", "cumulative", "each_iteration"] = "final"
    init: Literal["generator", "base"] = "base"  # what it starts from (and its frozen reference): base = M0 = G_SFT
    gold: bool = True  # D_VER <- D_SFT: the task's gold solutions are correct solutions too (where it has them)
    rationalized: bool = False  # pair the rationalized samples too (STaR's; V-STaR samples without hints)
    beta: Annotated[float, above(0)] = 0.1
    steps: NonNegInt = 100
    batch_size: PosInt = 8
    grad_accum: PosInt = 1
    max_pairs_per_question: NonNegInt = 0  # 0: every correct x incorrect pair of a question
    score: Literal["reward", "likelihood"] = "reward"
    optimizer: dict = field(default_factory=dict)
    adapter: dict = field(default_factory=dict)

    def preference_spec(self, steps: int, seed: int) -> PreferenceSpec:
        """The backend's DPO job (``optimizer``: the backend's object)."""
        return PreferenceSpec(steps, self.batch_size, self.grad_accum, seed, _handed(self.optimizer),
                              self.beta, _handed(self.adapter) if self.adapter else None)

    def train_spec(self) -> TrainSpec:
        """What the backend's ``validate_run`` checks of the job (its optimizer and adapter
        tables), as a ``TrainSpec`` under the key "verifier": one pair's sequences per row."""
        return TrainSpec(0, self.batch_size, self.grad_accum, 0, _handed(self.optimizer), packing="none",
                         adapter=_handed(self.adapter) if self.adapter else None)
