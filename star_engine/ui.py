"""The console and the event log: structlog JSON events in the run directory, the events and
progress on the console, the end-of-run summary table.

Where output goes, as ``pip`` does it: the command's narrative (events at info level, progress,
the summary table) on stdout; what needs attention (warnings, errors) on stderr. So
``star-engine run X > log.txt`` logs the run to ``log.txt`` while warnings and errors still reach
the terminal, and ``> log.txt 2>&1`` keeps everything in one file, in order. On a terminal,
progress is a live bar; elsewhere (a file, a pipe, nohup, a batch job) it is a line per stage at
an interval that grows with the stage's time (``LineProgress``); ``--quiet`` leaves errors
only. The summary table fits the terminal's width (short headers and a legend in a narrow one)
and is never cut elsewhere (``print_summary``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path
from typing import Any, TextIO
from collections.abc import Callable, Iterator, Sequence

import structlog
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .errors import UserError

RERUN_ENV = "STAR_ENGINE_RERUN"
"""Set to "1" in the environment by a plugin that runs the command again in its own process
(``os.execve``: the haiku_xmap backend does, for glibc's huge pages), so that what the command
said before the exec (the configuration's notes) is not said twice. ``rerun_started`` takes it
out of the environment when the command starts, so processes the command starts do not inherit it."""
_rerun = False


def rerun_started() -> None:
    """Called once when a command starts: whether this process is such a second run."""
    global _rerun
    _rerun = os.environ.pop(RERUN_ENV, "") == "1"


def note(line: str) -> None:
    """A ``note:`` line on stderr (a setting left unused, and why), said once per command."""
    if not _rerun:
        print(f"note: {line}", file=sys.stderr, flush=True)

console = Console()  # stdout (looked up at each write): the narrative
err_console = Console(stderr=True)  # warnings and errors
INTERVAL_ENV = "STAR_ENGINE_PROGRESS_INTERVAL"


@dataclass
class Output:
    """Where this process's command sends its output: the console settings and the run's event
    log. One per process (``OUTPUT``): ``configure_logging`` sets it (a command's start, a run
    directory's opening), ``close_run_log`` ends the log (the boundary, when the command ends)."""

    quiet: bool = False
    """``--quiet``: nothing on the console but errors."""
    interval: float | None = None
    """Seconds between progress lines off a terminal (None: adaptive, ``LineProgress``)."""
    events: TextIO | None = None
    """The run directory's ``events.jsonl``, once this run checked and locked it."""

    def close_events(self) -> None:
        f, self.events = self.events, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


OUTPUT = Output()


def _tee_json(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    f = OUTPUT.events
    if f is not None:
        try:
            f.write(json.dumps(event, default=str, sort_keys=True) + "\n")
            f.flush()
        except OSError as e:  # e.g. a full disk: one line naming the file, not a traceback
            OUTPUT.close_events()
            raise UserError(f"{f.name}: cannot write the event log ({e.strerror or e}); free some space and "
                            f"rerun to resume") from None
    return event


def _open_event_log(path: Path) -> TextIO:
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


def _stdout_gone() -> None:
    """The reader of stdout left (``star-engine run X | head``): the run goes on, its console
    output to /dev/null from now on (the run directory records everything), with one warning on
    stderr."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        return
    with contextlib.suppress(OSError, ValueError):
        print("warning: stdout was closed; the command goes on without its console output (a run's events "
              "are in RUN_DIR/events.jsonl)", file=sys.stderr, flush=True)


def _out(write: Callable[[], None]) -> None:
    """``write`` to stdout; a closed pipe there silences it (``_stdout_gone``), not the command."""
    try:
        write()
    except BrokenPipeError:
        _stdout_gone()


class _ConsoleLogger:
    """structlog's console logger: an event at warning level or above to stderr, the others to
    stdout; each stream looked up at each write (a live progress bar's redirection then keeps
    the line above the bar) and flushed (a log file shows it at once)."""

    def __init__(self, *_args: Any) -> None:
        pass

    def _stdout(self, message: str) -> None:
        _out(lambda: print(message, file=sys.stdout, flush=True))

    def _stderr(self, message: str) -> None:
        with contextlib.suppress(BrokenPipeError):  # (2>&1 | head: the reader left)
            print(message, file=sys.stderr, flush=True)

    msg = debug = info = _stdout
    warning = warn = error = err = critical = fatal = exception = _stderr


def progress_interval(environ: Any = os.environ) -> float | None:
    """``STAR_ENGINE_PROGRESS_INTERVAL``: seconds between progress lines when the output is no
    terminal (0: at every update); None when unset (adaptive, ``LineProgress``)."""
    value = environ.get(INTERVAL_ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds >= 0):
        raise UserError(f"{INTERVAL_ENV}: must be a number of seconds >= 0 (0: a line at every update), "
                        f"got {value!r}")
    return seconds


def configure_logging(run_dir: Path | None = None, quiet: bool | None = None) -> None:
    """Log to ``run_dir/events.jsonl`` (JSON, one event a line) and to the console
    (not with ``quiet``; None keeps the last setting, e.g. ``--quiet`` once the run
    directory is opened). Given ``quiet`` (a command's start), it also reads
    ``STAR_ENGINE_PROGRESS_INTERVAL`` (a bad value is a ``UserError``)."""
    if quiet is not None:
        OUTPUT.interval = progress_interval()
    quiet = OUTPUT.quiet if quiet is None else quiet
    OUTPUT.quiet = quiet
    if OUTPUT.events is not None:
        OUTPUT.events.close()
        OUTPUT.events = None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        OUTPUT.events = _open_event_log(run_dir / "events.jsonl")
    renderer: Callable[..., Any] = structlog.dev.ConsoleRenderer(colors=console.is_terminal and
                                                                 err_console.is_terminal)
    processors: list[Any] = [structlog.processors.add_log_level,
                             structlog.processors.TimeStamper(fmt="iso", utc=True), _tee_json]
    if quiet:
        processors.append(structlog.processors.JSONRenderer())
        factory: Any = structlog.ReturnLoggerFactory()
    else:
        processors.append(renderer)
        factory = _ConsoleLogger
    structlog.configure(processors=processors, logger_factory=factory, cache_logger_on_first_use=False)


def is_quiet() -> bool:
    """``--quiet``: nothing on the console but errors (the run directory records everything)."""
    return OUTPUT.quiet


def log_fatal(**fields: Any) -> None:
    """The failure that ends the command, as a ``fatal`` event in the run's event log: only
    when a run directory's log is open (this run checked and locked it), never elsewhere.
    Written directly (not through structlog) so that the console shows the error once."""
    f = OUTPUT.events
    if f is None:
        return
    event = {"event": "fatal", "level": "error", "timestamp": datetime.now(UTC).isoformat(),
             **{k: v for k, v in fields.items() if v is not None}}
    try:
        f.write(json.dumps(event, default=str, sort_keys=True) + "\n")
        f.flush()
    except (OSError, ValueError):  # a full disk (or a closed file) must not hide the error being reported
        pass


def close_run_log() -> None:
    """Stop writing to the run's event log (the command ended)."""
    OUTPUT.close_events()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class LineProgress:
    """Progress as lines, for output that is no terminal: a line at most every ``interval``
    seconds (None: adaptive, the larger of ``MIN_INTERVAL`` and a tenth of the stage's time so
    far, at most ``MAX_INTERVAL``: a line every 10 s in the first minutes, every 5 min in an
    hours-long stage), and one when the stage ends. A line: the stage, units done of the total,
    the share, the rate, the time elapsed and left. The rate and the time left are measured from
    the first report on: the first batch's time holds the step's compilation (seconds to
    minutes), which the rest of the stage does not pay again; until a second report there is no
    estimate, and the line says so."""

    MIN_INTERVAL = 10.0
    MAX_INTERVAL = 300.0

    def __init__(self, description: str, total: int, unit: str, interval: float | None,
                 write: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.description, self.total, self.unit, self.fixed = description, total, unit, interval
        self.write, self.clock = write, clock
        self.done = 0
        self.start = self.last = clock()
        self.first: tuple[float, int] | None = None  # (when, units done) at the first report

    def interval(self, elapsed: float) -> float:
        if self.fixed is not None:
            return self.fixed
        return min(self.MAX_INTERVAL, max(self.MIN_INTERVAL, elapsed / 10))

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.first is None:
            self.first = (now, self.done)
        if self.done < self.total and now - self.last >= self.interval(now - self.start):
            self.last = now
            self.write(self.line(now))

    def finish(self) -> None:
        """The stage's last line: every unit done (a backend need not report each one)."""
        self.done = self.total
        self.write(self.line(self.clock(), final=True))

    def rate(self, now: float) -> float | None:
        """Units per second since the first report (None before a second one)."""
        if self.first is None:
            return None
        when, done = self.first
        return (self.done - done) / (now - when) if self.done > done and now > when else None

    def line(self, now: float, final: bool = False) -> str:
        elapsed = now - self.start
        unit = self.unit + ("" if self.total == 1 else "s")
        parts = [f"{self.description}: {self.done}/{self.total} {unit}", f"{100 * self.done / self.total:.0f}%"]
        rate = self.rate(now)
        if rate is None and final and elapsed > 0 and self.done > 0:
            rate = self.done / elapsed  # one report only: the stage's whole time
        if rate:
            parts.append(f"{rate:.1f} {self.unit}s/s" if rate >= 1 else f"{1 / rate:.1f} s/{self.unit}")
        parts.append(f"{_clock(elapsed)} elapsed")
        if final:
            parts.append("done")
        elif rate:
            parts.append(f"{_clock((self.total - self.done) / rate)} left")
        elif self.done > 0:
            parts.append("time left estimated after the first batch (it includes compilation)")
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"{stamp} [progress ] " + ", ".join(parts)


def _print_line(line: str) -> None:
    _out(lambda: print(line, file=sys.stdout, flush=True))


def _nothing(n: int = 1) -> None:
    """A progress that shows nothing."""


@contextlib.contextmanager
def progress(description: str, total: int, unit: str = "prompt") -> Iterator[Callable[[int], None]]:
    """A stage's progress, ``total`` ``unit``s; yields ``advance(n)``. A live bar on a terminal,
    lines elsewhere (``LineProgress``), nothing with ``--quiet`` or nothing to do."""
    if OUTPUT.quiet or total <= 0:
        yield _nothing
    elif console.is_terminal:
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn(f"{unit}s"), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                       transient=False)
        with bar:
            task_id = bar.add_task(description, total=total)

            def advance(n: int = 1) -> None:
                bar.advance(task_id, n)
            yield advance
    else:
        lines = LineProgress(description, total, unit, OUTPUT.interval, _print_line)
        yield lines.advance
        lines.finish()  # (not when the stage failed)


# The summary table's columns: (full header, short header, legend of the short one). The
# short headers and their legend are used where the full table is wider than the terminal.
SUMMARY_COLUMNS = (("iteration", "it", "iteration"), ("split", "split", ""), ("accuracy", "acc", "accuracy"),
                   ("n", "n", "questions"), ("correct", "right", "answered right"),
                   ("rationalized", "rat", "rationalized (right only with the hint)"),
                   ("kept", "kept", "kept for fine-tuning"), ("steps", "steps", "fine-tuning steps"),
                   ("coverage", "cov", "train questions solved so far"))


FALLBACK_NOTE = ("* trained on the task's gold completions: nothing was kept (--smoke; metrics.parquet: "
                 "trained_on = gold_fallback)")


def summary_table(rows: Sequence[dict[str, Any]], short: bool = False, note: str | None = None) -> Table:
    """Per iteration and split, the accuracy (class "all") and counts; the fine-tuning columns
    (rationalized, kept, steps, coverage) on the train rows only, the steps marked "*" where a
    ``--smoke`` iteration trained on the gold completions. ``short``: short headers, with a
    legend in the caption; ``note``: a line for the caption (why the run stopped early)."""
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    num = lambda v: "–" if v is None else str(v)  # noqa: E731
    alls = [r for r in rows if r["class"] == "all"]
    fallback = any(r.get("trained_on") == "gold_fallback" for r in alls)
    notes = [", ".join(f"{s} = {what}" for full, s, what in SUMMARY_COLUMNS if s != full)] if short else []
    notes += [FALLBACK_NOTE] if fallback else []
    notes += [note] if note else []
    table = Table(title="STaR run summary", caption="\n".join(notes) or None, caption_justify="left")
    for full, s, _ in SUMMARY_COLUMNS:
        table.add_column(s if short else full, justify="left" if full == "split" else "right")
    for r in alls:
        steps = num(r.get("train_steps")) + ("*" if r.get("trained_on") == "gold_fallback" else "")
        fine_tuning = [num(r.get("rationalized")), num(r.get("kept")), steps, pct(r.get("coverage"))]
        table.add_row(str(r["iteration"]), r["split"], pct(r.get("accuracy")), num(r.get("n")), num(r.get("correct")),
                      *(fine_tuning if r["split"] == "train" else [""] * 4))
    return table


def _width(table: Table) -> int:
    """The width ``table`` takes when nothing limits it."""
    wide = Console(width=10_000, file=io.StringIO())
    return Measurement.get(wide, wide.options, table).maximum


def print_summary(rows: Sequence[dict[str, Any]], note: str | None = None) -> None:
    """The summary table on stdout: whole on a terminal wide enough, with short headers and a
    legend in a narrower one; elsewhere (a file, a pipe) whole, whatever its width. ``note``: a
    line under it (``summary_table``)."""
    full = summary_table(rows, note=note)
    if console.is_terminal:
        _out(lambda: console.print(full if _width(full) <= console.width else summary_table(rows, True, note)))
    else:
        _out(lambda: Console(file=sys.stdout, width=max(80, _width(full))).print(full))


def print_text(text: str) -> None:
    """A paragraph on stdout: wrapped on a terminal, one line elsewhere."""
    if console.is_terminal:
        _out(lambda: console.print(Text(text)))
    else:
        _out(lambda: print(text, file=sys.stdout, flush=True))


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
