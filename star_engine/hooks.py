"""Hook specifications of star-engine (specs only; no implementations here).

Plugins implement these with ``@star_engine.hookimpl`` and are found through the
``star_engine`` entry-point group. The ``register_*`` hooks are called once, when
the registry is built; each receives ``register(name, factory)``. A factory is a
callable taking the component's keyword options (its TOML table, less ``name``)
and returning an object of the matching protocol in :mod:`star_engine.api`.
The ``on_*`` hooks are observers: they are called during a run, their return
values are ignored, and an exception in one is reported with the plugin's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

import pluggy

hookspec = pluggy.HookspecMarker("star_engine")


@hookspec
def register_tasks(register) -> None:
    """Register dataset loaders (tasks).

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.Task`. ``options`` come from ``[task.options]``.
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_checkers(register) -> None:
    """Register answer checkers.

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.Checker`. ``options`` come from the
            ``task.checker`` table, or from an ``evaluation.checkers`` entry (a checker
            whose verdicts on the evaluation answers are recorded beside the task's).
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_hint_formatters(register) -> None:
    """Register hint formatters used for rationalization.

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.HintFormatter`. ``options`` come from the
            ``task.hint`` table.
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_filters(register) -> None:
    """Register rationale filters (applied after the checker, in TOML order).

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.RationaleFilter`. ``options`` come from the
            filter's entry in ``task.filters``.
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_schedules(register) -> None:
    """Register step schedules (optimizer steps per STaR iteration).

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.StepSchedule`. ``options`` come from the
            ``training.schedule`` table.
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_samplers(register) -> None:
    """Register question samplers (which train questions each STaR iteration draws).

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.QuestionSampler`. ``options`` come from the
            ``generation.sampler`` table.
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_tuners(register) -> None:
    """Register sampling tuners (the temperature each STaR iteration samples its rationales at).

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.SamplingTuner`. ``options`` come from the
            ``generation.tuner`` table.
    Returns: nothing.
    Called: once, when the registry is built; the tuner's ``tune`` is called once per
        iteration, before the iteration generates.
    """


@hookspec
def register_engines(register) -> None:
    """Register generation engines (what samples the run's prompts instead of the backend).

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.GenerationEngine`. ``options`` come from the
            ``[generation.server]`` table; ``[generation] engine`` names the engine.
    Returns: nothing.
    Called: once, when the registry is built; the engine's ``start`` once per run.
    """


@hookspec
def register_backends(register) -> None:
    """Register model backends.

    Args:
        register: ``register(name, factory)``; ``factory(**options)`` returns a
            :class:`star_engine.api.Backend`. ``options`` are the ``[model]``
            table less ``backend``.
    Returns: nothing.
    Called: once, when the registry is built.
    """


@hookspec
def register_commands(register) -> None:
    """Register extra ``star-engine`` subcommands (e.g. a backend's ``convert``).

    Args:
        register: ``register(name, factory)``; ``factory()`` returns an object with
            ``help`` (one line), ``add_arguments(parser)`` (an argparse parser) and
            ``run(args) -> int`` (the exit code; raise ``UserError`` for bad input).
    Returns: nothing.
    Called: once, when the registry is built; the commands appear in ``star-engine --help``.
    """


@hookspec
def on_run_start(run_dir: Path, config: Mapping[str, Any]) -> None:
    """A run starts or resumes.

    Args:
        run_dir: the run directory.
        config: the resolved experiment configuration (plain dicts and lists), as in
            ``config.json``: ``task.checker`` and ``task.hint`` name the components that
            run (the task's defaults when the experiment names none; ``task.hint`` is {}
            when no hint is used).
    Returns: nothing.
    Called: once per ``star-engine run`` invocation, before any stage.
    """


@hookspec
def on_iteration_start(run_dir: Path, iteration: int) -> None:
    """A STaR iteration starts (or resumes).

    Args:
        run_dir: the run directory.
        iteration: 1-based iteration number (0 is the base-model evaluation).
    Returns: nothing.
    Called: at the start of every iteration, also of those a resumed run finds
        already done (their stages then return stored results).
    """


@hookspec
def on_iteration_end(run_dir: Path, iteration: int, metrics: Sequence[Mapping[str, Any]],
                     losses: Sequence[float]) -> None:
    """A STaR iteration finished.

    Args:
        run_dir: the run directory.
        iteration: 1-based iteration number (0 is the base-model evaluation).
        metrics: this iteration's rows of ``metrics.parquet``.
        losses: the training loss per optimizer step of this iteration ([] if none).
    Returns: nothing.
    Called: once per iteration when its metrics are written.
    """


@hookspec
def on_run_end(run_dir: Path, metrics: Sequence[Mapping[str, Any]]) -> None:
    """The run finished (all iterations, or early stop).

    Args:
        run_dir: the run directory.
        metrics: every row of ``metrics.parquet``.
    Returns: nothing.
    Called: once, after the last iteration and the report.
    """
