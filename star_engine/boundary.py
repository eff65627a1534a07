"""The one place where a command's failure becomes what the user sees.

Every command (``run``, ``validate``, ``report``, ``plugins`` and the plugins' own,
``convert`` and ``plan``) ends here:

==============================================  =========  =========================================
failure                                         exit code  shown
==============================================  =========  =========================================
``UserError`` (bad input: a file, TOML, data,     2        ``error: <message>`` on one line
checkpoint, run directory, plugin)
``OSError`` of the filesystem (a folder where     2        ``error: <file>: <reason>`` on one line
a file should be, no permission, a full disk)
``MemoryError``                                   2        one line: the machine or its limits
``ProcessLost`` (another process of a             3        one line
multi-process run stopped)
``KeyboardInterrupt``, SIGTERM                  130, 143   one line: rerun to resume
anything else: a bug                              1        the traceback, then one line asking for
                                                           a report (naming the distribution whose
                                                           code raised it)
==============================================  =========  =========================================

A message is always one line (line breaks inside it are shown as ``\\n``). A plugin's
failure (a ``PluginError`` raised from what the plugin raised) keeps that exception's
traceback for its author: in the ``fatal`` event, and on stderr before the line with
``STAR_ENGINE_TRACEBACK=1``. A run whose directory already belongs to it (its event log is
open: after the run directory was checked and locked) also gets the failure as a ``fatal`` event in ``events.jsonl``:
kind, message, exit code and, for a bug, the traceback. In a multi-process run the
other processes are told to stop, with the same line (``procs.Processes.stopping_others_on_failure``).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from contextlib import contextmanager
from collections.abc import Callable, Iterator

from . import ui
from .errors import PluginError, ProcessLost
from .failures import Terminated, classify
from .rundir.runlock import release_locks

def report(e: BaseException) -> int:
    """Print what ``e`` means for the user and record it in the run's event log when the run
    owns its directory; returns the exit code."""
    kind, code, message = classify(e)
    tb_text = "".join(traceback.format_exception(e)) if kind == "bug" else None
    if tb_text is not None:
        sys.stderr.write(tb_text)
    elif isinstance(e, PluginError) and e.__cause__ is not None:  # what a plugin raised: for its author
        tb_text = "".join(traceback.format_exception(e.__cause__))
        if os.environ.get("STAR_ENGINE_TRACEBACK", "") not in ("", "0"):
            sys.stderr.write(tb_text)
    print(f"{'' if code >= 130 else 'error: '}{message}", file=sys.stderr, flush=True)
    ui.log_fatal(kind=kind, message=message, exit_code=code, traceback=tb_text)
    return code


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` in the main thread (recorded like Ctrl-C) for the block."""
    try:
        old = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave it as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def run_command(command: Callable[[], int]) -> int:
    """Run a command; every failure ends here (see the module docstring)."""
    try:
        with sigterm_stops():
            return int(command())
    except SystemExit:
        raise
    except BrokenPipeError:  # `star-engine plugins | head`: the reader left, nothing to say
        _silence_stdout()
        return 0
    except BaseException as e:  # noqa: BLE001 -- this is the boundary
        code = report(e)
        if isinstance(e, ProcessLost) and e.exit_now:  # the other process is gone: do not wait for it
            ui.close_run_log()
            sys.stdout.flush()
            os._exit(code)
        return code
    finally:
        ui.close_run_log()
        release_locks()


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
