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

from .errors import UserError

console = Console(stderr=True)
_event_file: list[Any] = [None]
_quiet: list[bool] = [False]


def _tee_json(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    f = _event_file[0]
    if f is not None:
        try:
            f.write(json.dumps(event, default=str, sort_keys=True) + "\n")
            f.flush()
        except OSError as e:  # e.g. a full disk: one line naming the file, not a traceback
            _event_file[0] = None
            with contextlib.suppress(OSError):
                f.close()
            raise UserError(f"{f.name}: cannot write the event log ({e.strerror or e}); free some space and "
                            f"rerun to resume") from None
    return event


def _open_event_log(path: Path) -> Any:
    """Append to the event log, first dropping a torn last line (a write cut short by a
    kill or a full disk), so that every line stays one JSON event."""
    if path.exists():
        with open(path, "rb+") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - (1 << 20)))
            tail = f.read()
            if tail and not tail.endswith(b"\n") and (b"\n" in tail or len(tail) == size):
                f.truncate(size - len(tail) + tail.rfind(b"\n") + 1)
    return open(path, "a", encoding="utf-8")  # noqa: SIM115


def configure_logging(run_dir: Path | None = None, quiet: bool | None = None) -> None:
    """Log to ``run_dir/events.jsonl`` (JSON, one event a line) and to the console
    (not with ``quiet``; None keeps the last setting, e.g. ``--quiet`` once the run
    directory is opened)."""
    quiet = _quiet[0] if quiet is None else quiet
    _quiet[0] = quiet
    if _event_file[0] is not None:
        _event_file[0].close()
        _event_file[0] = None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        _event_file[0] = _open_event_log(run_dir / "events.jsonl")
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
