"""How ``star_engine`` and ``star_engine.helpers`` load their names: each from the private module
that defines it, on first use, then kept in the namespace (so importing either costs nothing)."""

from __future__ import annotations

import importlib
from typing import Any
from collections.abc import Mapping, MutableMapping


def load(namespace: MutableMapping[str, Any], modules: Mapping[str, str], name: str, owner: str) -> Any:
    """``name`` of module ``owner`` (whose globals are ``namespace``), imported from
    ``star_engine.<modules[name]>`` and kept there; AttributeError for a name it does not have."""
    module = modules.get(name)
    if module is None:
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"star_engine.{module}"), name)
    namespace[name] = value
    return value
