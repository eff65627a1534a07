"""Options declared once, checked by one validator.

Every component declares its options where Python already writes them down, with their
types, defaults and allowed ranges, and nothing checks them again:

- a section of the experiment file (``settings``), a backend's optimizer table: a frozen
  dataclass whose fields are the keys (``seed: NonNegInt = 0``);
- a plugin's factory (a task, checker, hint formatter, filter, schedule, sampler, the
  backend's ``[model]`` table): its keyword parameters are the options
  (``def __init__(self, *, max_chars: Annotated[int, at_least(1)] = 2000)``).

Types are Python's: ``str``, ``int``, ``float`` (an integer is taken and made a float; never
NaN or infinite), ``bool``, ``list[str]``/``tuple[str, ...]``, ``dict`` (a table),
``Literal["a", "b"]`` (one of these), ``X | None`` (None only as the default: TOML has no
null), ``Any``; constraints ride on ``Annotated``: a :class:`Range` (``at_least``, ``above``,
``between``), :data:`NON_EMPTY`. :func:`declared` reads a dataclass or a signature into
:class:`Option` s, :func:`validate` checks a table against them before anything is built:
unknown keys, missing ones, each value's type and range, defaults filled in. Every failure
is a ``UserError`` whose ``key`` is the dotted TOML key and whose message starts with it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeGuard, Union

from ..errors import UserError


def close_matches(name: str, names: list[str]) -> str:
    """`` (did you mean 'a', 'b'?)`` for the names like ``name``, else ``""``."""
    m = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(repr(x) for x in m)}?)" if m else ""


def is_int(value: Any) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool`` (TOML's ``true`` is no integer)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An ``int`` or a ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # an option without a default


@dataclass(frozen=True)
class Range:
    """Allowed numbers: ``lo``..``hi``, each end closed unless ``*_open``."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def ok(self, v: float) -> bool:
        return (v > self.lo if self.lo_open else v >= self.lo) and (v < self.hi if self.hi_open else v <= self.hi)

    @property
    def rule(self) -> str:
        if self.hi == math.inf:
            return f"must be {'>' if self.lo_open else '>='} {_num(self.lo)}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"must be in {left}{_num(self.lo)}, {_num(self.hi)}{right}"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else str(v)


def at_least(lo: float) -> Range:
    return Range(lo)


def above(lo: float) -> Range:
    return Range(lo, lo_open=True)


def between(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Range:
    return Range(lo, hi, lo_open, hi_open)


@dataclass(frozen=True)
class _Marker:
    name: str


NON_EMPTY = _Marker("non-empty")  # a string or list with at least one element
COMPONENT = _Marker("component")  # a plugin's name, or a table with 'name' and its options
COMPONENTS = _Marker("components")

NonNegInt = Annotated[int, at_least(0)]
PosInt = Annotated[int, at_least(1)]
NonNegFloat = Annotated[float, at_least(0)]
Fraction = Annotated[float, between(0, 1)]
Component = Annotated[Any, COMPONENT]
Components = Annotated[list, COMPONENTS]

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a table"}


@dataclass(frozen=True)
class Option:
    """One declared option: its type (``Annotated`` taken apart into ``type`` and
    ``constraints``) and default (``REQUIRED``: none)."""

    name: str
    type: Any
    constraints: tuple[Any, ...] = ()
    default: Any = REQUIRED

    @classmethod
    def of(cls, name: str, hint: Any, default: Any = REQUIRED) -> Option:
        constraints: tuple[Any, ...] = ()
        while typing.get_origin(hint) is Annotated:
            constraints += tuple(hint.__metadata__)
            hint = hint.__origin__
        return cls(name, hint, constraints, default)

    def check(self, value: Any, key: str) -> Any:
        """``value`` as the component receives it (an integer given for a float made a float),
        or a ``UserError`` for ``key``."""
        return _checked(self.type, self.constraints, value, key)



def describe_value(v: Any) -> str:
    """A TOML value in words, with its kind: ``string 'x'``, ``integer 3``."""
    kind = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "table"}
    return f"{kind.get(type(v), type(v).__name__)} {v!r}"


def _type_words(t: Any, constraints: tuple[Any, ...] = ()) -> str:
    t, constraints = _unwrap(t, constraints)
    if COMPONENT in constraints:
        return "a name or a table with 'name'"
    if COMPONENTS in constraints:
        return "a list of names or tables with 'name'"
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t in _NAMES:
        return _NAMES[t]
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple) or t in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        return f"a list of {_type_words(inner[0]).removeprefix('a ').removeprefix('an ')}s" if inner else "a list"
    if origin is dict:
        return "a table"
    if origin in (Union, types.UnionType):
        return " or ".join(_type_words(a) for a in args if a is not type(None))
    return "a value"


class _Mismatch(UserError):
    """A value of the wrong type (not a value out of range): a union tries its next member."""


def _unwrap(t: Any, constraints: tuple[Any, ...] = ()) -> tuple[Any, tuple[Any, ...]]:
    while typing.get_origin(t) is Annotated:
        constraints += tuple(t.__metadata__)
        t = t.__origin__
    return t, constraints


def _checked(t: Any, constraints: tuple[Any, ...], value: Any, key: str) -> Any:
    """``value`` checked against type ``t`` (``Annotated`` at any depth: in a list, a union),
    then against the constraints."""
    t, constraints = _unwrap(t, constraints)
    out = _check_type(t, constraints, value, key)
    for c in constraints:
        if isinstance(c, Range) and not c.ok(out):
            raise UserError(f"{key}: {c.rule}, got {value!r}", key=key)
        if c is NON_EMPTY and len(out) == 0:
            raise UserError(f"{key}: must not be empty", key=key)
    return out


def _check_type(t: Any, constraints: tuple[Any, ...], value: Any, key: str) -> Any:
    def bad(what: str | None = None) -> UserError:
        return _Mismatch(f"{key}: expected {what or _type_words(t, constraints)}, got {describe_value(value)}", key=key)

    if COMPONENT in constraints:
        if isinstance(value, str) or (isinstance(value, dict) and isinstance(value.get("name"), str)):
            return copy.deepcopy(value)
        raise bad()
    if COMPONENTS in constraints:
        if isinstance(value, list) and all(
                isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("name"), str)) for v in value):
            return copy.deepcopy(value)
        raise bad()
    if t is Any or t is object:
        return copy.deepcopy(value)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (Union, types.UnionType):
        out_of_range = None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _checked(arg, (), value, key)
            except _Mismatch:
                continue
            except UserError as e:  # the right type, out of its range: say so, unless another member takes it
                out_of_range = out_of_range or e
        raise UserError(str(out_of_range), key=key) if out_of_range else bad()
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        near = close_matches(value, [a for a in args if isinstance(a, str)]) if isinstance(value, str) else ""
        raise UserError(f"{key}: must be one of {', '.join(str(a) for a in args)}, got {value!r}{near}", key=key)
    if t is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad()
    if t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise UserError(f"{key}: must be a finite number, got {value!r}", key=key)
            return float(value)
        raise bad()
    if t is str:
        if isinstance(value, str):
            return value
        raise bad()
    if t is dict or origin is dict:
        if isinstance(value, dict):
            return copy.deepcopy(value)
        raise bad()
    if t in (list, tuple) or origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        if not isinstance(value, list):
            raise bad()
        if inner:
            return [_checked(inner[0], (), v, f"{key}[{i}]") for i, v in enumerate(value)]
        return copy.deepcopy(value)
    raise TypeError(f"{key}: no validator for the declared type {t!r}")


def declared(obj: Any) -> dict[str, Option]:
    """The options ``obj`` declares: a dataclass's fields, or a callable's keyword parameters
    (a class: its ``__init__``'s), by name. A callable without a readable signature, or with
    ``**kwargs``, declares what it names and takes anything more (``open``)."""
    if dataclasses.is_dataclass(obj) and isinstance(obj, type):
        hints = typing.get_type_hints(obj, include_extras=True)
        out = {}
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = REQUIRED
            out[f.name] = Option.of(f.name, hints.get(f.name, Any), default)
        return out
    target = obj.__init__ if isinstance(obj, type) else obj  # type: ignore[misc]  # a class: its own __init__
    sig = inspect.signature(obj)
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001 -- an annotation that does not resolve checks nothing
        hints = {}
    return {p.name: Option.of(p.name, hints.get(p.name, Any), REQUIRED if p.default is p.empty else p.default)
            for p in sig.parameters.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def open_ended(obj: Any) -> bool:
    """Whether ``obj`` takes options it does not name (``**kwargs``)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def validate(data: Mapping[str, Any], options: Mapping[str, Option], prefix: str, *,
             what: str = "", section: str = "", extra: bool = False,
             nested: Callable[[str], Mapping[str, Option] | None] | None = None) -> dict[str, Any]:
    """``data`` checked against ``options`` and completed with their defaults. ``prefix`` is
    the key path before each option (``"task.checker."``); ``what`` names the component in
    an unknown option's message (a plugin's: "checker 'regex'"), ``section`` the table (the
    core's sections); ``extra``: keys not declared pass unchecked (a ``**kwargs`` factory).
    ``nested(name)``: the options of a field that is itself a table of declared options."""
    out: dict[str, Any] = {}
    if not extra:
        for key in data:
            if key not in options:
                path = f"{prefix}{key}"
                names = list(options)
                if what:
                    raise UserError(f"{path}: unknown option for {what}; accepted: "
                                    f"{', '.join(names) or '(none)'}{close_matches(key, names)}", key=path)
                raise UserError(f"unknown key '{path}'{close_matches(key, names)}; allowed in "
                                f"[{section or prefix.rstrip('.') or 'top level'}]: {', '.join(names)}", key=path)
    missing = [name for name, opt in options.items() if opt.default is REQUIRED and name not in data
               and not (nested and nested(name) is not None)]
    if missing and what:
        raise UserError(f"{prefix.rstrip('.')}: {what} needs option(s) {', '.join(missing)}",
                        key=f"{prefix}{missing[0]}")
    for name, opt in options.items():
        path = f"{prefix}{name}"
        inner = nested(name) if nested else None
        if inner is not None:
            value = data.get(name, {})
            if not isinstance(value, dict):
                raise UserError(f"{path}: expected a table, got {describe_value(value)}", key=path)
            out[name] = validate(value, inner, path + ".", nested=None)
        elif name in data:
            out[name] = opt.check(data[name], path)
        elif opt.default is REQUIRED:
            what_ = "table" if opt.type is dict else "key"
            raise UserError(f"missing required {what_} '{path}'", key=path)
        else:
            default = copy.deepcopy(opt.default)
            out[name] = list(default) if isinstance(default, tuple) else default
    if extra:
        out.update({k: copy.deepcopy(v) for k, v in data.items() if k not in options})
    return out
