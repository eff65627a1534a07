"""How ``star_engine`` and ``star_engine.helpers`` load their names: each from the private module
that defines it, on first use, then kept in the namespace (so importing either costs nothing); and
how the module paths that moved keep working for a release (``MovedModules``, ``forward``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import types
import warnings
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


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module paths that moved (``star_engine.store`` → ``star_engine.rundir.store``, issue #40):
    importing the old path warns (``DeprecationWarning``) and gives the new module itself (the
    same object, so classes and functions are identical), until release 0.2."""

    def __init__(self, moved: Mapping[str, str], until: str) -> None:
        self.moved, self.until = dict(moved), until

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = self.moved[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in release {self.until}",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module is the new one, already imported."""


def forward(owner: str, target: str, names: tuple[str, ...], name: str, until: str) -> Any:
    """A package that took an old module's name (``star_engine.config`` was ``config.py``): the old
    module's public ``name`` from ``target``, with a ``DeprecationWarning``; AttributeError otherwise."""
    if name not in names:
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    warnings.warn(f"{owner}.{name} moved to {target}.{name}; the old name goes in release {until}",
                  DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(target), name)
