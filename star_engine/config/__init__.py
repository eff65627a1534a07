"""Configuration: an experiment file and its ``--set`` overrides become one typed ``Config``.

``schema`` (the one option validator), ``settings`` (the core's sections, frozen dataclasses),
``registry`` (plugin discovery: each component built from its table, its options checked by
``schema``), ``load`` (TOML, overrides, paths, defaults, origins: ``load_experiment``),
``effects`` (settings that switch others off), ``smoke``, ``dataroot`` and ``datafiles`` (where a
task's files are, and reading them within bounds).

Until release 0.2 the names of the former module ``star_engine/config.py`` are forwarded from
here with a ``DeprecationWarning``; they live in ``star_engine.config.load``."""

from __future__ import annotations

from typing import Any

from ..lazy import forward

_OLD = ("Config", "SWEEP", "SCHEMA", "check_table", "parse_override", "apply_overrides", "Origins", "TOML_MAX",
        "load_toml", "NAME_MAX", "normalize_component", "load_experiment")


def __getattr__(name: str) -> Any:
    return forward(__name__, "star_engine.config.load", _OLD, name, "0.2")
