"""Turning a validated config into live components and loaded data.

Everything here runs before the run directory is touched, so bad input (an
unknown plugin, a bad option, a malformed data row, an empty split) stops the
command with nothing written.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import labelfree
from ..rundir import procs
from ..api import (Backend, Checker, Example, GenerationEngine, HintFormatter, QuestionSampler, RationaleFilter,
                   SamplingTuner, StepSchedule, Task)
from ..capabilities import TrainsVerifiers
from ..errors import UserError
from ..config.registry import Registry, option_defaults
from ..config.load import Config
from .verdicts import Panel, build_panel, screen


@dataclass
class Experiment:
    config: Config
    registry: Registry
    task: Task
    checker: Checker
    checker_name: str
    hint: HintFormatter | None  # None: the run does not rationalize
    filters: list[tuple[str, RationaleFilter]]
    schedule: StepSchedule
    sampler: QuestionSampler | None  # None: questions are drawn uniformly
    backend: Backend
    splits: dict[str, list[Example]]
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{"checker": {"name": ...}, "hint": ..., "model": {...}}``: what ``task.checker`` and
    ``task.hint`` resolve to when left empty (the task's defaults), and the backend's defaults of
    its ``[model]`` options (``registry.option_defaults``); ``rundir.layout`` reads a run
    directory written before they were recorded (``config.json`` with ``{}``, a ``[model]``
    without them) through it."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each component's options as it runs (``component_options``: key path -> the options
    written and its factory's defaults of the others); the manifest records them and a
    resumed run compares them (``rundir.layout``), so a plugin's changed default is seen."""
    processes: procs.Processes = field(default_factory=procs.Processes)
    """The backend's process layout (``procs.configure``): who writes the run directory."""
    panel: Panel = field(default_factory=Panel)
    """The ``[evaluation] checkers`` (``star_engine.run.verdicts``) and the gold answers skipped."""
    reward: Checker | None = None
    """``task.reward``: what judges the training samples (generation, rationalization, a tuner's
    probes) when it is not the task's checker; None: the checker does."""
    tuner: SamplingTuner | None = None
    """``generation.tuner``: None: every iteration samples at ``generation.temperature``."""
    engine: GenerationEngine | None = None
    """``generation.engine`` (its options ``[generation.server]``): None: the backend samples."""

    @property
    def run_dir(self) -> Path:
        return Path(self.config.experiment.output_dir)

    def calling(self, component: Any, method: str) -> AbstractContextManager[None]:
        """``with exp.calling(exp.task, "prompt"): exp.task.prompt(kind)``: a failure of the call
        names the plugin that provides the component (``Registry.calling``)."""
        return self.registry.calling(component, method)

    def notify(self, hook: str, **kwargs: Any) -> None:
        """Call an observer hook of every plugin (``Registry.notify``); in a multi-process
        run only process 0 does (observers write files)."""
        if self.processes.primary:
            self.registry.notify(hook, **kwargs)


def _options(ref: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ref.items() if k != "name"}


def build(config: Config, registry: Registry, load_data: bool = True) -> Experiment:
    """The live components of the loaded configuration (``load_experiment``), and the ``Config``
    with ``task.checker`` (and ``task.hint``, when the run uses a hint) resolved: left empty,
    they become the task's defaults (``{"name": task.default_checker}``), so that
    ``config.json`` names what runs."""
    t = config.task
    task = registry.create("task", t.dataset, t.options, "task.dataset", "task.options")
    defaults = {"checker": {"name": task.default_checker}, "hint": {"name": task.default_hint}}
    resolved: dict[str, Any] = {"checker": t.checker or dict(defaults["checker"])}
    checker = registry.create("checker", resolved["checker"]["name"], _options(resolved["checker"]), "task.checker")
    hint = None
    if config.rationalization.enabled and config.training.source == "generated":
        resolved["hint"] = t.hint or dict(defaults["hint"])
        hint = registry.create("hint", resolved["hint"]["name"], _options(resolved["hint"]), "task.hint")
    config = replace(config, task=replace(t, **resolved))
    panel = build_panel(config.evaluation.checkers, registry, resolved["checker"], checker)
    filters = [(f["name"], registry.create("filter", f["name"], _options(f), f"task.filters[{i}]"))
               for i, f in enumerate(t.filters)]
    sched = config.training.schedule
    schedule = registry.create("schedule", sched["name"], _options(sched), "training.schedule")
    samp = config.generation.sampler
    sampler = registry.create("sampler", samp["name"], _options(samp), "generation.sampler") if samp else None
    tune = config.generation.tuner
    tuner = registry.create("tuner", tune["name"], _options(tune), "generation.tuner") if tune else None
    rew = config.task.reward
    reward = (None if not rew or dict(rew) == dict(resolved["checker"]) else
              registry.create("checker", rew["name"], _options(rew), "task.reward"))
    labelfree.check_components(config, checker, [e.checker for e in panel.entries], reward)  # group, label-free
    engine = build_engine(config, registry)
    backend_options = {k: v for k, v in config.model.items() if k != "backend"}
    backend = registry.create("backend", config.model["backend"], backend_options, "model")
    if config.verifier.enabled and not isinstance(backend, TrainsVerifiers):
        raise UserError(f"verifier.enabled: backend {config.model['backend']!r} trains no verifier (it has no "
                        f"train_preferences and score); set verifier.enabled = false", key="verifier.enabled")
    # config.json's [model]: the options written and the backend's defaults of the others (its
    # factory's keyword defaults), so that it names every option the backend ran with.
    factory = registry.get("backend", config.model["backend"], "model.backend").factory
    defaults["model"] = option_defaults(factory)
    for kind, table in (getattr(factory, "adapter_tables", None) or {}).items():  # config.json completes them
        defaults[f"adapter.{kind}"] = option_defaults(table)
    config = replace(config, model={"backend": config.model["backend"], **defaults["model"], **backend_options})
    # Ask for the few-shot prompts the run will use now, so that a kind the task lacks
    # fails before anything runs.
    plain, hinted = prompt_kinds(config)
    with registry.calling(task, "prompt"):
        task.prompt(plain)
    if hint is not None:
        with registry.calling(task, "prompt"):
            task.prompt(hinted)
    exp = Experiment(config, registry, task, checker, resolved["checker"]["name"], hint, filters, schedule, sampler,
                     backend, {}, defaults, component_options(config, registry),
                     procs.configure(backend, registry.origin(backend)), panel, reward, tuner, engine)
    if load_data:
        exp.splits = load_splits(config, task, checker, panel, registry, reward)
    return exp


def build_engine(config: Config, registry: Registry) -> GenerationEngine | None:
    """``[generation] engine`` with the ``[generation.server]`` table its options; None: the
    backend's own sampler (a ``[generation.server]`` table without an engine is refused)."""
    gen = config.generation
    if not gen.engine:
        if gen.server:
            raise UserError("generation.server: the table is the options of a generation engine, and "
                            "generation.engine names none (set generation.engine = \"server\")",
                            key="generation.server")
        return None
    return registry.create("engine", gen.engine, gen.server, "generation.engine", "generation.server")


COMPONENTS = (("task.options", "task"), ("task.checker", "checker"), ("task.hint", "hint"),
              ("task.reward", "checker"), ("task.filters", "filter"), ("training.schedule", "schedule"),
              ("generation.sampler", "sampler"), ("generation.tuner", "tuner"), ("evaluation.checkers", "checker"))
"""The configuration's component tables (key path, kind): a table ``{"name": ..., **options}``,
a list of them, or ``task.options`` (the task's, named by ``task.dataset``)."""


def component_options(config: Config, registry: Registry) -> dict[str, dict[str, Any]]:
    """Key path (``"task.filters[1]"``) -> the options of the component there as it runs: those
    written and its factory's defaults of the others (``registry.option_defaults``)."""
    cfg, out = config.as_dict(), {}
    for path, kind in COMPONENTS:
        section, key = path.split(".")
        node = cfg[section][key]
        entries = list(enumerate(node)) if isinstance(node, list) else [(None, node)]
        for i, table in entries:
            name = cfg["task"]["dataset"] if path == "task.options" else (table or {}).get("name")
            if not isinstance(table, dict) or not name:
                continue  # "" or {}: no component there
            where = path if i is None else f"{path}[{i}]"
            found = option_defaults(registry.get(kind, name, where if kind != "task" else "task.dataset").factory)
            out[where] = {**found, **{k: v for k, v in table.items() if k != "name"}}
    if cfg["generation"].get("engine"):  # the engine's options are the [generation.server] table (no name)
        found = option_defaults(registry.get("engine", cfg["generation"]["engine"], "generation.engine").factory)
        out["generation.server"] = {**found, **cfg["generation"].get("server", {})}
    return out


def prompt_kinds(config: Config) -> tuple[str, str]:
    """The few-shot prompt kinds a run asks its task for: (plain, hinted)."""
    return ("direct", "direct_hint") if config.task.direct else ("rationale", "hint")


def load_splits(config: Config, task: Task, checker: Checker, panel: Panel, registry: Registry,
                reward: Checker | None = None) -> dict[str, list[Example]]:
    """Every split the run uses, checked, their gold answers screened (``verdicts.screen``) by
    ``checker`` (the task's) and ``panel`` (the evaluation checkers); ``registry`` built them.
    The training split (``task.train_split``) follows ``reward``'s needs (``labelfree``: a
    label-free one trains on questions without gold answers)."""
    limit = config.experiment.limit
    train, judge = config.task.train_split, reward or checker
    wanted = [train, *config.evaluation.splits]
    data = config.task.data
    splits: dict[str, list[Example]] = {}
    for split in dict.fromkeys(wanted):
        path = data.get(split)
        if path is not None and not Path(path).exists():
            root = config.task.data_root
            where = ((f" (under task.data_root {root}, which STAR_ENGINE_DATA replaces; " if root else " (")
                     + "star-engine data check lists the files the installed tasks read; README.md 'Getting the "
                       "data' says where the built-in tasks' files come from)")
            raise UserError(f"task.data.{split}: no such file: {path}{where}", key=f"task.data.{split}")
        try:
            with registry.calling(task, "load"):
                loaded = task.load(split, path)
            examples = list(loaded)
        except UserError as e:
            if path is not None or split == train:
                raise
            # No file for a split the run reads because evaluation.splits names it: that key's
            # doing, not task.data's (which may well have been given as a whole by --set).
            raise UserError(f"evaluation.splits: split '{split}': {e}", key='evaluation.splits') from None
        if limit:
            examples = examples[:limit]
        if not examples:
            raise UserError(f"task.data.{split}: split '{split}' is empty ({path or 'generated by the task'})", key=f"task.data.{split}")
        ids = [e.id for e in examples]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise UserError(f"task.data.{split}: duplicate question id {dup!r} ({path or 'generated by task ' + repr(config.task.dataset)})",
                            key=f"task.data.{split}")
        if split != train or labelfree.screens_training_split(config, judge):
            examples = screen(split, examples, path, checker, config.task.checker["name"], panel,
                              split in config.evaluation.splits, registry)
        if split == train:
            labelfree.check_training_split(config, examples, judge, (config.task.reward or config.task.checker)["name"])
        if not examples:
            raise UserError(f"task.data.{split}: every gold answer of split '{split}' was skipped by checker "
                            f"'{config.task.checker['name']}' ({path or 'generated by the task'})", key=f"task.data.{split}")
        splits[split] = examples
    return splits


def config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()
