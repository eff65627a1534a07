"""Console and event log: structlog JSON events in the run directory, a readable
console, progress bars and the end-of-run summary table."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)
_event_file: list[Any] = [None]


def _tee_json(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    f = _event_file[0]
    if f is not None:
        f.write(json.dumps(event, default=str, sort_keys=True) + "\n")
        f.flush()
    return event


def configure_logging(run_dir: Path | None = None, quiet: bool = False) -> None:
    """Log to ``run_dir/events.jsonl`` (JSON, one event a line) and to the console."""
    if _event_file[0] is not None:
        _event_file[0].close()
        _event_file[0] = None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        _event_file[0] = open(run_dir / "events.jsonl", "a", encoding="utf-8")  # noqa: SIM115
    renderer: Callable[..., Any] = structlog.dev.ConsoleRenderer(colors=console.is_terminal)
    processors: list[Any] = [structlog.processors.add_log_level,
                             structlog.processors.TimeStamper(fmt="iso", utc=True), _tee_json]
    if quiet:
        processors.append(structlog.processors.JSONRenderer())
        factory: Any = structlog.ReturnLoggerFactory()
    else:
        processors.append(renderer)
        factory = structlog.PrintLoggerFactory(file=sys.stderr)
    structlog.configure(processors=processors, logger_factory=factory, cache_logger_on_first_use=False)


@contextlib.contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar; yields ``advance(n)``."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
                   disable=not console.is_terminal)
    with bar:
        task_id = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task_id, n)


def summary_table(rows: Sequence[dict[str, Any]]) -> Table:
    """Per-iteration accuracy (class 'all') and counts."""
    table = Table(title="STaR run summary")
    for col in ("iter", "split", "accuracy", "n", "correct", "rationalized", "kept", "steps", "coverage"):
        table.add_column(col, justify="right")
    for r in rows:
        if r["class"] != "all":
            continue
        table.add_row(str(r["iteration"]), r["split"], f"{100 * r['accuracy']:.1f}%", str(r["n"]),
                      str(r["correct"]), str(r["rationalized"]), str(r["kept"]), str(r["train_steps"]),
                      f"{100 * r['coverage']:.1f}%")
    return table
