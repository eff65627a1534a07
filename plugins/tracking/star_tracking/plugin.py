"""Hook implementations: star-engine calls these observers during a run.

The plugin registers no component; it only watches. Its return values are
ignored by the core, and an exception here would stop the run naming this
plugin, so the tracker keeps its work to writing files it owns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from star_engine import hookimpl

from . import tracker


@hookimpl
def on_run_start(run_dir: Path, config: Mapping[str, Any]) -> None:
    tracker.start(run_dir, config)


@hookimpl
def on_iteration_end(run_dir: Path, iteration: int, metrics: Sequence[Mapping[str, Any]],
                     losses: Sequence[float]) -> None:
    tracker.iteration_end(run_dir, iteration, metrics, losses)


@hookimpl
def on_run_end(run_dir: Path, metrics: Sequence[Mapping[str, Any]]) -> None:
    tracker.finish(run_dir, metrics)
