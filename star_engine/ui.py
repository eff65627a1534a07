"""Console and event log: structlog JSON events in the run directory, a readable
console, progress bars and the end-of-run summary table."""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

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


def log_fatal(**fields: Any) -> None:
    """The failure that ends the command, as a ``fatal`` event in the run's event log: only
    when a run directory's log is open (this run checked and locked it), never elsewhere.
    Written directly (not through structlog) so that the console shows the error once."""
    f = _event_file[0]
    if f is None:
        return
    event = {"event": "fatal", "level": "error", "timestamp": datetime.now(timezone.utc).isoformat(),
             **{k: v for k, v in fields.items() if v is not None}}
    try:
        f.write(json.dumps(event, default=str, sort_keys=True) + "\n")
        f.flush()
    except (OSError, ValueError):  # a full disk (or a closed file) must not hide the error being reported
        pass


def close_run_log() -> None:
    """Stop writing to the run's event log (the command ended)."""
    f, _event_file[0] = _event_file[0], None
    if f is not None:
        with contextlib.suppress(OSError):
            f.close()


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


def plugin_listing(info: Sequence[dict[str, Any]]) -> None:
    """``star-engine plugins``: a table on a terminal (cells fold, never crop), plain lines
    elsewhere (a pipe, a file), so that a broken plugin's distribution and error are always
    shown whole."""
    out = Console()  # stdout
    rows = []
    for p in info:
        comps = [f"{k}: {', '.join(v)}" for k, v in sorted(p["components"].items())]
        comps = comps or ["hooks: " + ", ".join(p["hooks"])]  # observer-only plugins
        rows.append((p["name"], p["distribution"], p["version"], comps, p["error"]))
    if not out.is_terminal:
        for name, dist, version, comps, error in rows:
            print(f"{name} ({dist} {version}): {'ERROR: ' + error if error else 'ok'}")
            for c in comps:
                print(f"    {c}")
        return
    table = Table(title="star-engine plugins")
    for col in ("plugin", "distribution", "version", "components", "status"):
        table.add_column(col, overflow="fold")
    for name, dist, version, comps, error in rows:
        table.add_row(*(Text(x) for x in (name, dist, version, "\n".join(comps), error or "ok")))  # no markup
    out.print(table)
