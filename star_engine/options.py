"""Checks for plugin factory options; every failure is a UserError naming the option.

TOML gives typed values, but ``strip = "yes"`` or ``max_chars = 1.5`` parse fine,
so a factory checks the types of its options with these helpers. The core puts
the TOML key path in front of the message (``task.checker: pattern: ...``).
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Iterable

from star_engine.errors import UserError
from star_engine.schema import is_int, is_number


def require_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{name}: must be true or false, got {value!r}")
    return value


def require_int(name: str, value: Any, minimum: int = 0) -> int:
    if not is_int(value):
        raise UserError(f"{name}: must be an integer, got {value!r}")
    if value < minimum:
        raise UserError(f"{name}: must be >= {minimum}, got {value!r}")
    return value


def require_float(name: str, value: Any, minimum: float = 0.0, strict: bool = False) -> float:
    """A finite number >= ``minimum`` (> ``minimum`` when ``strict``)."""
    if not is_number(value):
        raise UserError(f"{name}: must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise UserError(f"{name}: must be a finite number {relation} {minimum}, got {value!r}")
    return float(value)


def require_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise UserError(f"{name}: must be one of {allowed}, got {value!r}")
    return value


def require_str(name: str, value: Any, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise UserError(f"{name}: must be a string, got {value!r}")
    if not allow_empty and not value:
        raise UserError(f"{name}: must not be empty")
    return value


def require_str_list(name: str, value: Any) -> list[str]:
    """A list (possibly empty) of non-empty strings."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UserError(f"{name}: must be a list of non-empty strings, got {value!r}")
    return list(value)
