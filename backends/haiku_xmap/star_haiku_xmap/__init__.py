"""GPT-J backend for star-engine: dm-haiku model, (dp, mp) mesh sharding, AdamW
training with masked loss, KV-cache sampling. Registered as backend ``haiku_xmap``.

The package by concern, lowest floor first: ``runtime/`` (process layout, mesh and its rule
table, heartbeat and barriers, huge pages, environment variables), ``model/`` (the networks,
their config, LoRA), ``checkpoint/`` (the native format), ``tokenizer``, ``options`` (its
tables), ``session/`` (the started machine, a multi-process run's writes, the weights on the
devices), ``preflight``, ``train/`` (fine-tuning, DPO and LoRA stages, packing, resumable
snapshots), ``sampling/``, ``engine`` (the backend's jax-using bodies), ``plan/``,
``convert/``, ``inference``, and at the door ``plugin`` (the backend the core builds, jax-free:
one deferred import of ``engine``). Importing the package, or the plugin, imports no jax.

The modules that lay at the top before 0.1.x's folders (``star_haiku_xmap.gptj``,
``star_haiku_xmap.config``, ...) still import, with a ``DeprecationWarning``, until 0.2:
``MOVED`` maps each to its new module (the same module object), and the old ``model`` and
``train`` modules, now packages, lend their old names (``old_name``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

MOVED: dict[str, str] = {  # old module (under this package) -> its new one
    "config": "model.config", "gptj": "model.gptj", "llama": "model.llama", "layers": "model.layers",
    "architectures": "model.architectures", "lora": "model.lora",
    "packing": "train.packing", "packplan": "train.packplan", "resume": "train.resume",
    "lora_stage": "train.lora_stage", "preference": "train.preference",
    "machine": "session.machine", "distributed": "session.distributed", "coordination": "runtime.coordination",
    "sharding": "runtime.sharding", "envvars": "runtime.envvars",
}
# Old modules whose name is now a package's: the package lends the module's names.
LENT = {"model": "model.network", "train": "train.trainer"}


def _moved(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old name goes in release 0.2", DeprecationWarning, stacklevel=3)


class _Alias(importlib.abc.Loader):
    """Loads an old module path as the new module itself (no second copy)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _moved(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of ``MOVED``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(f"{__name__}.{MOVED[name]}"))


def old_name(package: str, name: str) -> Any:
    """The attribute ``name`` of package ``package`` (``model``, ``train``: ``LENT``) that the
    old module of that name held (a package's ``__getattr__``); a submodule's name, or a
    dunder, is no old name (``AttributeError``, nothing imported)."""
    short = package.rpartition(".")[2]
    if short not in LENT or name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    new = f"{__name__}.{LENT[short]}"
    value = getattr(importlib.import_module(new), name)
    _moved(f"{package}.{name}", f"{new}.{name}")
    return value


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())  # before any other finder of this package's modules
