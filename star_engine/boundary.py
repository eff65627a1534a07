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

import errno
import os
import signal
import sys
import traceback
from contextlib import contextmanager
from importlib import metadata
from collections.abc import Callable, Iterator

from . import __version__, ui
from .errors import PluginError, ProcessLost, StarEngineError
from .rundir.runlock import release_locks

# errno values that say the filesystem or the machine refused something, not that the code is wrong
ENVIRONMENT_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM,
                      errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG, errno.ELOOP, errno.EMFILE,
                      errno.ENFILE, errno.EIO, errno.EFBIG, errno.ENOTEMPTY, errno.EXDEV, errno.EBUSY}


class Terminated(BaseException):
    """SIGTERM (a preemptible machine going away, ``kill``): stop like Ctrl-C."""


def one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _oserror_message(e: OSError) -> str:
    reason = e.strerror or str(e)
    names = [str(f) for f in (e.filename, e.filename2) if f is not None]
    return f"{' -> '.join(names)}: {reason}" if names else f"{reason} (errno {e.errno})"


def _culprit(tb) -> str:
    """Whose code raised the exception: the distribution ("name version") of its innermost frame
    outside the standard library, or that frame's module when no distribution has it."""
    try:
        owners = metadata.packages_distributions()
    except Exception:  # noqa: BLE001 -- a broken environment must not hide the bug being reported
        owners = {}
    for frame, _ in reversed(list(traceback.walk_tb(tb))):
        module = str(frame.f_globals.get("__name__", ""))
        top = module.split(".")[0]
        if not top or top in sys.stdlib_module_names:
            continue
        for dist in owners.get(top, []):
            try:
                return f"{dist} {metadata.version(dist)}"
            except metadata.PackageNotFoundError:
                continue
        return f"module {module} ({frame.f_code.co_filename})"
    return f"star-engine {__version__}"


def classify(e: BaseException) -> tuple[str, int, str]:
    """(kind, exit code, one-line message) of a command's failure (the module docstring's table)."""
    if isinstance(e, StarEngineError):
        kind, code, message = type(e).__name__, e.exit_code, str(e)
    elif isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
        kind, code, message = "OSError", 2, _oserror_message(e)
    elif isinstance(e, MemoryError):
        kind, code = "MemoryError", 2
        message = (f"out of memory ({e or 'MemoryError'}): the machine, or a limit set on this process, has too "
                   f"little memory for what was asked (a smaller model, batch or mesh needs less)")
    elif isinstance(e, (KeyboardInterrupt, Terminated)):
        kind, code = type(e).__name__, (130 if isinstance(e, KeyboardInterrupt) else 143)
        message = "interrupted; rerun the same command to resume"
    else:
        kind, code = "bug", 1
        message = (f"{type(e).__name__}: {e} -- this is a bug in {_culprit(e.__traceback__)}, not a problem with "
                   f"your input; please report it with the traceback above")
    return kind, code, one_line(message)


def failure_message(e: BaseException) -> str:
    """The one line a failure is shown as."""
    return classify(e)[2]


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
