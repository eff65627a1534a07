"""Errors that end a command with a one-line message and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a TOML file, a data file, an option.

    The message must say where (``file:line[:col]`` or a dotted key path) and
    what is wrong. The CLI prints it on one line and exits with code 2.
    """

    exit_code = 2


class IntegrityError(UserError):
    """A stored artifact does not match its recorded checksum or format."""


class PluginError(UserError):
    """A plugin is broken, missing or ambiguous."""
