"""Errors that end a command with a one-line message (``star_engine.boundary``).

``UserError`` and its subclasses are bad input: exit code 2. ``ProcessLost`` is a
multi-process run losing one of its processes: exit code 3. Any other exception
is a bug: the command prints its traceback and asks for a report (exit code 1).
"""

from __future__ import annotations


class StarEngineError(Exception):
    """An expected failure: the CLI prints ``error: <message>`` on one line and exits
    with ``exit_code``; no traceback."""

    exit_code = 1


class UserError(StarEngineError):
    """Bad input from the user: a TOML file, a data file, an option, a run directory.

    The message must say where (``file:line[:col]`` or a dotted key path) and
    what is wrong. The CLI prints it on one line and exits with code 2.
    """

    exit_code = 2

    def __init__(self, message: str, *, key: str | None = None):
        super().__init__(message)
        self.key = key  # the dotted configuration key at fault, when one is (``schema.validate``)
        self.placed = False  # its origin (the file or the --set) is in the message (``Origins.place``)


class IntegrityError(UserError):
    """A stored artifact does not match its recorded checksum or format."""


class PluginError(UserError):
    """A plugin is broken, missing or ambiguous."""


class ProcessLost(StarEngineError):
    """Another process of a multi-process run stopped (it failed, was killed, or no
    longer answers): this one stops too. Rerun every process to resume.

    ``exit_now``: the other process is gone (not just failing), so this one exits at
    once instead of waiting for it in the runtime's shutdown."""

    exit_code = 3

    def __init__(self, message: str, *, exit_now: bool = False):
        super().__init__(message)
        self.exit_now = exit_now
