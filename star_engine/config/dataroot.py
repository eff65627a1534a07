"""The data root, and what ``star-engine data check`` (``star_engine.report.datacheck``) reports: which
files an experiment (or every installed task) expects, and whether each is there with the content
its task knows (sha256).

The data root is the folder that ``task.data`` and the task's file options
(``task.options`` keys ending in ``_file``, ``_path``, ``_dir``) are relative to. An
experiment file names it with ``[task] data_root`` (relative to the file); the environment
variable ``STAR_ENGINE_DATA`` replaces that value, once for every experiment that has one
(a file without ``data_root`` names its files relative to itself, and the variable leaves
it alone); ``--set task.data_root=...`` replaces both. The shipped experiments say
``data_root = "../../shared/data"``: the data in a folder ``shared/data`` beside the clone.

Known files: a task factory may carry ``data_files``, a sequence of ``api.DataFile``
(relative path, sha256, source, license): the files it reads from the data root in their
public releases. ``check`` compares each file with them; it reads only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Mapping

from ..api import DataFile
from ..errors import PluginError, UserError

ENV = "STAR_ENGINE_DATA"
HASH_CHUNK = 1 << 20


def resolve_root(value: str, base: Path, from_set: bool, environ: Mapping[str, str] | None = None
                 ) -> tuple[Path | None, str]:
    """The data root and where it came from, for ``task.data_root`` = ``value`` (``""``: none) of
    an experiment file in ``base``; ``from_set``: the value came from ``--set`` (it then wins
    over ``STAR_ENGINE_DATA``). A relative root is relative to the file, or, from the
    environment, to the working directory."""
    env = (os.environ if environ is None else environ).get(ENV, "")
    if value and env and not from_set:
        return absolute(Path.cwd(), env, ENV), ENV
    if value:
        return absolute(base, value, "task.data_root"), ("--set task.data_root" if from_set else "task.data_root")
    return None, ""


def absolute(base: Path, value: str, key: str) -> Path:
    if "\0" in value:
        raise UserError(f"{key}: a path cannot contain a NUL character", key=key)
    try:
        return (base / os.path.expanduser(value)).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise UserError(f"{key}: not a usable path ({e})", key=key) from None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def known_files(registry: Any) -> tuple[dict[str, tuple[str, DataFile]], list[str]]:
    """Every installed task's ``data_files`` by relative path, as (task name, file), and the
    conflicts (two tasks giving one path different hashes: a line naming both). A task factory
    without the attribute knows no files; a malformed declaration is the plugin's error, named."""
    out: dict[str, tuple[str, DataFile]] = {}
    conflicts: list[str] = []
    for name in registry.names("task"):
        comp = registry.components["task"][name]
        if comp.plugin.error:
            continue
        files = getattr(comp.factory, "data_files", ())
        if not isinstance(files, (list, tuple)) or not all(isinstance(f, DataFile) for f in files):
            raise PluginError(f"{comp.plugin.label}: task '{name}'.data_files must be a sequence of "
                              f"star_engine.api.DataFile")
        for f in files:
            seen = out.get(f.path)
            if seen is not None and seen[1].sha256 != f.sha256:
                conflicts.append(f"{f.path}: task '{seen[0]}' expects sha256 {seen[1].sha256}, task '{name}' "
                                 f"{f.sha256}")
            out.setdefault(f.path, (name, f))
    return out, conflicts


@dataclass(frozen=True)
class Status:
    """One expected file: ``state`` is "ok" (there, its known hash), "different" (there, another
    hash), "present" (there; no hash known), "missing"."""

    key: str  # the configuration key naming it ("task.data.train"), or "task <name>" for a known file
    path: Path
    state: str
    known: DataFile | None = None
    actual: str | None = None  # its sha256, when there is a known one to compare


def status(key: str, path: Path, root: Path | None, known: Mapping[str, tuple[str, DataFile]]) -> Status:
    rel = relative(path, root)
    if rel is None or rel not in known:  # outside the root (or no root): a known file by its last parts
        posix = path.as_posix()
        rel = next((k for k in known if posix.endswith("/" + k)), None)
    info = known[rel][1] if rel is not None else None
    if not path.exists():
        return Status(key, path, "missing", info)
    if info is None or info.sha256 is None or not path.is_file():
        return Status(key, path, "present", info)
    actual = sha256(path)
    return Status(key, path, "ok" if actual == info.sha256 else "different", info, actual)


def relative(path: Path, root: Path | None) -> str | None:
    """``path`` relative to ``root`` as a '/'-separated string, or None when it is not inside."""
    if root is None:
        return None
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def experiment_files(cfg: Any) -> list[tuple[str, Path]]:
    """The files a resolved configuration (``config.load.Config``) names for its task and
    components: ``task.data.<split>`` and every option ending in ``_file``/``_path``/``_dir``
    (not ``[model]``: weights are not data)."""
    task, generation = cfg.task, cfg.generation
    out = [(f"task.data.{k}", Path(v)) for k, v in task.data.items()]
    for key, node in (("task.options", task.options), ("task.checker", task.checker), ("task.reward", task.reward),
                      ("task.hint", task.hint), ("task.filters", list(task.filters)),
                      ("generation.sampler", generation.sampler), ("generation.tuner", generation.tuner),
                      ("training.schedule", cfg.training.schedule),
                      ("evaluation.checkers", list(cfg.evaluation.checkers))):
        out += _paths(node, key)
    return out


def _paths(node: Any, key: str) -> list[tuple[str, Path]]:
    if isinstance(node, dict):
        out = []
        for k, v in node.items():
            if isinstance(v, str) and v and k.endswith(("_file", "_path", "_dir")):
                out.append((f"{key}.{k}", Path(v)))
            else:
                out += _paths(v, f"{key}.{k}")
        return out
    if isinstance(node, list):
        return [p for i, x in enumerate(node) for p in _paths(x, f"{key}[{i}]")]
    return []


def check(files: Iterable[tuple[str, Path]], root: Path | None, known: Mapping[str, tuple[str, DataFile]]
          ) -> list[Status]:
    return [status(key, path, root, known) for key, path in files]


def report(statuses: list[Status], root: Path | None, where: str, out: Callable[[str], None]) -> None:
    """The check's lines: the root, then one line per file (its state, key and path, and for a
    missing or different one where it comes from)."""
    out(f"data root: {root} ({where})" if root else "data root: none (paths relative to the experiment file)")
    width = max((len(s.key) for s in statuses), default=0)
    for s in statuses:
        shown = relative(s.path, root) or str(s.path)
        line = f"  {s.state:<9} {s.key:<{width}}  {shown}"
        if s.state == "different" and s.known is not None:  # (a different file has a known hash)
            line += f"  sha256 {s.actual}, expected {s.known.sha256}"
        if s.state in ("missing", "different") and s.known is not None:
            line += f"  [{s.known.source}; {s.known.license}]"
        out(line)
