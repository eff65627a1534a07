"""What a failure means for the user: its kind, exit code and one-line message (``classify``; the
table is ``boundary``'s docstring). Below everything that reports a failure: the command boundary
(``boundary.report``) and a multi-process run telling the other processes why it stops
(``rundir.procs``)."""

from __future__ import annotations

import errno
import sys
import traceback
from importlib import metadata

from .version import __version__
from .errors import StarEngineError

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
