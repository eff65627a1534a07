"""A reasoning-gym dataset's configuration, from a TOML table to the dataset's own config class.

``[task.options] config = {...}`` is checked against the dataset's config dataclass before
anything is drawn: an unknown key (with the close names), a value of the wrong type, then the
class's own ``validate()``, each a UserError naming the key (``config.min_terms: ...``; the
core puts ``task.options:`` in front). TOML gives lists where the classes want tuples, strings
where they want enums, dates or times: those are converted. ``seed`` and ``size`` are the
task's (its streams, ``star_rgym.task``), not the table's.

A configuration has two forms: *typed* (what ``create_dataset`` takes) and *plain* (JSON: what
a gold answer carries, ``star_rgym.gold``); ``typed(name, plain(...))`` gives the typed form back.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from star_engine import UserError
from star_engine.helpers import close_matches, is_int, is_number

from .library import dataset_classes, quiet, short

RESERVED = {"seed": "task.options.seed", "size": "task.options.size_train, size_dev and size_test"}
"""Keys of every config class that the task sets itself (its reproducible, disjoint streams)."""


def typed(name: str, table: Any, key: str = "config") -> dict[str, Any]:
    """The keyword arguments of dataset ``name``'s config class from the TOML table ``table``
    (``seed`` and ``size`` excluded), checked and converted; UserError naming the key."""
    _, config_cls = dataset_classes(name)
    if not isinstance(table, Mapping):
        raise UserError(f"{key}: must be a table of dataset {name!r}'s options, got {table!r}", key=key)
    out = _fields(config_cls, table, key, f"reasoning-gym dataset {name!r}", reserved=True)
    if name == "composite":
        if not out.get("datasets"):
            raise UserError(f"{key}.datasets: the composite dataset needs a list of "
                            f"{{ name = ..., weight = ..., config = {{...}} }} tables", key=f"{key}.datasets")
        names = [spec.name for spec in out["datasets"]]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise UserError(f"{key}.datasets: dataset {dup!r} is listed twice", key=f"{key}.datasets")
    return out


def plain(value: Any) -> Any:
    """The JSON form of a typed value (``typed`` reads it back)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def canonical(plain_config: Mapping[str, Any]) -> str:
    """One string per configuration (cache key, and what a gold answer carries)."""
    return json.dumps(plain_config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def build(name: str, config: Mapping[str, Any], seed: int, size: int, key: str = "config",
          size_key: str = "size") -> Any:
    """Dataset ``name`` with the typed ``config``; the config class's ``validate()`` and the
    dataset's constructor refusing it are a UserError naming the key their message mentions
    first (``size_key`` for the size)."""
    dataset_cls, config_cls = dataset_classes(name)
    try:
        with quiet():
            cfg = config_cls(**config, seed=seed, size=size)
            if callable(getattr(cfg, "validate", None)):
                cfg.validate()
            return dataset_cls(config=cfg)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  (assertions, ValueError, TypeError from the library)
        found = [(m.start(), f.name) for f in dataclasses.fields(config_cls)
                 if (m := re.search(rf"\b{re.escape(f.name)}\b", str(e)))]
        first = min(found)[1] if found else None
        where = size_key if first == "size" else key if first in (None, "seed") else f"{key}.{first}"
        raise UserError(f"{where}: reasoning-gym dataset {name!r} refused its configuration: "
                        f"{short(e)}") from None


# ----------------------------------------------------------------------------- conversion


def _fields(cls: type, table: Mapping[str, Any], key: str, what: str, reserved: bool = False) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    accepted = [n for n in fields if not (reserved and n in RESERVED)]
    out: dict[str, Any] = {}
    for k, v in table.items():
        if reserved and k in RESERVED:
            raise UserError(f"{key}.{k}: set by the task, not the dataset's table: use {RESERVED[k]}", key=f"{key}.{k}")
        if k not in fields:
            raise UserError(f"{key}.{k}: unknown option of {what}; accepted: {', '.join(accepted)}"
                            f"{close_matches(k, accepted)}", key=f"{key}.{k}")
        out[k] = _convert(v, hints.get(k, Any), f"{key}.{k}")
    missing = [n for n in accepted if n not in out and fields[n].default is dataclasses.MISSING
               and fields[n].default_factory is dataclasses.MISSING]  # type: ignore[misc]
    if missing:
        raise UserError(f"{key}: {what} needs option(s) {', '.join(missing)}", key=key)
    return out


def _convert(value: Any, ann: Any, key: str) -> Any:
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if ann is Any or ann is typing.Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        first: UserError | None = None
        for a in options:
            try:
                return _convert(value, a, key)
            except UserError as e:
                first = first or e
        raise first or UserError(f"{key}: unexpected value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise UserError(f"{key}: must be one of {', '.join(map(repr, args))}, got {value!r}", key=key)
        return value
    if origin in (list, tuple, Sequence) or ann in (list, tuple):
        return _sequence(value, origin or ann, args, key)
    if origin is dict or ann is dict:
        if not isinstance(value, Mapping):
            raise UserError(f"{key}: must be a table, got {value!r}", key=key)
        return dict(value)
    if isinstance(ann, type):
        return _scalar(value, ann, key)
    return value


def _sequence(value: Any, kind: Any, args: tuple, key: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise UserError(f"{key}: must be a list, got {value!r}", key=key)
    if kind is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise UserError(f"{key}: must be a list of {len(args)} values, got {value!r}", key=key)
        return tuple(_convert(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    item = args[0] if args else Any
    items = [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if kind is tuple else items


_SCALARS: dict[type, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "true or false"), int: (is_int, "an integer"),
    float: (is_number, "a number"), str: (lambda v: isinstance(v, str), "a string")}
"""The plain types a TOML value has: how to tell one, and its name in a message."""


def _scalar(value: Any, ann: type, key: str) -> Any:
    if ann in _SCALARS:
        ok, words = _SCALARS[ann]
        if not ok(value):
            raise UserError(f"{key}: must be {words}, got {value!r}", key=key)
        return float(value) if ann is float else value
    if ann in (datetime.date, datetime.time):
        return _when(value, ann, key)
    if issubclass(ann, enum.Enum):
        for member in ann:
            if value is member or value == member.value or value == member.name:
                return member
        raise UserError(f"{key}: must be one of {', '.join(repr(m.value) for m in ann)}, got {value!r}", key=key)
    if dataclasses.is_dataclass(ann):
        if not isinstance(value, Mapping):
            raise UserError(f"{key}: must be a table ({ann.__name__}), got {value!r}", key=key)
        if ann.__name__ == "DatasetSpec":
            return _dataset_spec(ann, value, key)
        return ann(**_fields(ann, value, key, ann.__name__))
    if not isinstance(value, ann):
        raise UserError(f"{key}: must be a {ann.__name__}, got {value!r}", key=key)
    return value


def _when(value: Any, ann: type, key: str) -> Any:
    if ann is datetime.date and isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value
    if ann is datetime.time and isinstance(value, datetime.time):
        return value
    if isinstance(value, str):
        try:
            return typing.cast(Any, ann).fromisoformat(value)
        except ValueError:
            pass
    what = "a date (1900-01-01)" if ann is datetime.date else "a time of day (08:30:00)"
    raise UserError(f"{key}: must be {what}, got {value!r}", key=key)


def _dataset_spec(cls: type, value: Mapping[str, Any], key: str) -> Any:
    """One dataset of a composite: its name, weight and its own configuration, checked as
    the top-level one is (no seed or size: the composite derives them from its own)."""
    spec = _fields(cls, {"config": {}, **value}, key, "a composite's dataset")
    name = spec["name"]
    if name == "composite":
        raise UserError(f"{key}.name: a composite cannot hold a composite", key=f"{key}.name")
    dataset_classes(name, f"{key}.name")
    if not is_number(spec["weight"]) or spec["weight"] <= 0:
        raise UserError(f"{key}.weight: must be a number > 0, got {spec['weight']!r}", key=f"{key}.weight")
    spec["config"] = typed(name, spec.get("config", {}), f"{key}.config")
    return cls(**spec)
