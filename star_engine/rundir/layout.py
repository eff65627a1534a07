"""A run directory before anything is written to it: whether this run may use it and what it
holds.

``inspect`` only reads. It refuses (``UserError``, nothing written) an
``experiment.output_dir`` that is a file or cannot be created, a folder that holds
something else, a run of another configuration, and an unreadable or inconsistent
``config.json`` or ``manifest.json``. ``validate`` and ``run`` both call it
(``runner.preflight``); ``run`` calls it again once it holds the lock.

The lock (``star_engine.rundir.runlock``) is taken by ``run`` only; ``report`` and ``validate``
only read and never lock.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from ..config.datafiles import not_utf8
from ..errors import UserError
from .fsio import in_the_way, is_temporary
from .runlock import LOCK
from .store import read_json_file, read_manifest

CONFIG_MAX = 64 << 20
FILES = ("experiment.toml", "config.json", "manifest.json", "requirements.txt", "events.jsonl", "metrics.parquet",
         "questions.parquet", "pairs.jsonl", "report.png", "report.md", LOCK)
FOLDERS = ("base", "iterations")
# Keys that may change when a run is resumed: they extend or observe it, they do not change its results.
RESUMABLE_CHANGES = {"experiment.iterations", "experiment.early_stop_patience", "experiment.output_dir"}


@dataclass
class RunDir:
    root: Path
    resume: bool  # holds a run of this configuration (config.json)
    manifest: dict | None  # its manifest.json, checked (None: none yet)


def diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configurations."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def _names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()} - {LOCK}


def killed_at_start(root: Path) -> bool:
    """A run directory whose first start died before writing config.json: it holds only
    the files a start writes first (events.jsonl, experiment.toml) and temporaries."""
    names = {n for n in _names(root) if not is_temporary(n)}
    return "events.jsonl" in names and names <= {"events.jsonl", "experiment.toml"}


def _check_usable(root: Path) -> None:
    """``root`` is a folder this process may use, or can be created."""
    shown = not_utf8(str(root))  # a name of bytes that are not UTF-8: Parquet, JSON and the logs need text
    if shown is not None:
        raise UserError(f"experiment.output_dir: {shown}: not valid UTF-8; choose a folder whose path is text",
                        key='experiment.output_dir')
    if root.exists() or root.is_symlink():
        if not root.is_dir():
            raise UserError(f"experiment.output_dir: {root} exists and is not a folder", key='experiment.output_dir')
        if not os.access(root, os.R_OK | os.W_OK | os.X_OK):
            raise UserError(f"experiment.output_dir: {root}: no permission to read and write this folder", key='experiment.output_dir')
        for name in FILES:
            if in_the_way(root / name):
                raise UserError(f"{root / name}: exists and is not a file (a run directory's {name} is one); "
                                f"move it away")
        for name in FOLDERS:
            if in_the_way(root / name, folder=True):
                raise UserError(f"{root / name}: exists and is not a folder (a run directory's {name}/ is one); "
                                f"move it away")
        return
    parent = root.parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"experiment.output_dir: {root} cannot be created: {parent} is not a folder", key='experiment.output_dir')
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"experiment.output_dir: {root} cannot be created: no permission to write in {parent}", key='experiment.output_dir')


def inspect(cfg: dict[str, Any], defaults: Mapping[str, Any] | None = None,
            options: Mapping[str, Mapping[str, Any]] | None = None) -> RunDir:
    """What the run directory of ``cfg`` holds, refusing what a run must not touch (reads only).
    ``defaults`` (``Experiment.defaults``) is what an empty ``task.checker`` / ``task.hint``
    stood for in a ``config.json`` written before the resolved names were recorded.
    ``options`` (``Experiment.options``): each component's options as it will run, compared
    with those the manifest recorded (``component_options``) when it has them, so that a
    plugin's default that changed since the run began is a changed configuration."""
    root = Path(cfg["experiment"]["output_dir"])
    _check_usable(root)
    cfg_file = root / "config.json"
    if cfg_file.exists():
        old = read_json_file(cfg_file, CONFIG_MAX, "config.json")
        if not isinstance(old, dict):
            raise UserError(f"{cfg_file}: unreadable config.json (not a JSON object); move the run directory away "
                            f"to start over")
        manifest = read_manifest(root)
        ran = (manifest or {}).get("component_options")
        old, new = _with_defaults(old, cfg, defaults or {}), cfg
        if isinstance(ran, dict) and options is not None:  # compare what ran with what will run
            # an option the run's plugin did not have yet (nor the experiment writes) ran as its default
            filled = {w: {**{k: v for k, v in opts.items() if k not in (_table(cfg, w) or {})}, **ran[w]}
                      for w, opts in options.items() if isinstance(ran.get(w), dict)}
            old, new = with_options(old, filled), with_options(cfg, options)
        changed = [k for k in diff(old, new) if k not in RESUMABLE_CHANGES]
        if changed:
            shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
            note = _defaults_note(changed, cfg, ran)
            raise UserError(f"{root}: holds a run of a different configuration (changed: {shown}); "
                            f"{note + ', or ' if note else ''}set experiment.output_dir to a new folder")
        return RunDir(root, True, manifest)
    if root.is_dir() and _names(root) and not killed_at_start(root):
        if cfg_file.exists():  # another run wrote it since it was looked for: a run directory after all
            return inspect(cfg, defaults, options)
        raise UserError(f"{root}: exists and is not a star-engine run directory; choose another experiment.output_dir")
    return RunDir(root, False, None)


def _table(cfg: Any, where: str) -> Any:
    """The table at key path ``where`` (``"task.filters[1]"``) of ``cfg``, or None."""
    node = cfg
    for part in re.split(r"[.\[\]]+", where):
        if not part:
            continue
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def with_options(cfg: dict[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``cfg`` whose component tables (``options``: key path -> options as run) name
    every option, written or defaulted."""
    cfg = json.loads(json.dumps(cfg))
    for where, opts in options.items():
        table = _table(cfg, where)
        if isinstance(table, dict) and isinstance(opts, dict):
            table.update({k: v for k, v in opts.items() if k not in table})
    return cfg


def _defaults_note(changed: list[str], cfg: dict[str, Any], ran: Any) -> str:
    """For a changed option the experiment does not write (a plugin's default that changed
    since the run began): what the run used and how to resume with it."""
    if not isinstance(ran, dict):
        return ""
    for key in changed:
        where, _, opt = key.rpartition(".")
        table, used = _table(cfg, where), ran.get(where)
        if isinstance(table, dict) and opt not in table and isinstance(used, dict) and opt in used:
            return (f"{key} is a default of the installed plugin, not the one the run used "
                    f"({json.dumps(used[opt])}): write {key} = {json.dumps(used[opt])} to resume as it ran")
    return ""


def _with_defaults(old: dict[str, Any], cfg: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``old`` with an empty ``task.checker`` / ``task.hint`` (a run directory written before
    config.json named the task's defaults) read as the default it stood for, where the new
    configuration resolved to that same default; a ``[model]`` option left out (written before
    ``config.json`` held the backend's defaults) as its default, where the new configuration has
    that default; an ``adapter`` table likewise (written before ``config.json`` completed it with
    its declaration's defaults); without ``evaluation.checkers``, ``experiment.smoke`` or
    ``task.data_root`` (written before those keys) as with their defaults."""
    ev = old.get("evaluation")
    if isinstance(ev, dict) and "checkers" not in ev:  # written before [evaluation] checkers: none
        old = {**old, "evaluation": {**ev, "checkers": []}}
    exp = old.get("experiment")
    if isinstance(exp, dict) and "smoke" not in exp:  # written before --smoke: not a smoke run
        old = {**old, "experiment": {**exp, "smoke": False}}
    model = old.get("model")
    if isinstance(model, dict) and isinstance(cfg.get("model"), dict):  # written before [model] had its defaults
        filled = {k: v for k, v in defaults.get("model", {}).items() if k not in model and cfg["model"].get(k) == v}
        old = {**old, "model": {**model, **filled}}
    for section in ("base_training", "training", "verifier"):  # an adapter written before its defaults were
        table, new = (old.get(section) or {}).get("adapter"), (cfg.get(section) or {}).get("adapter")
        if isinstance(table, dict) and table and isinstance(new, dict):
            filled = {k: v for k, v in defaults.get(f"adapter.{table.get('kind')}", {}).items()
                      if k not in table and new.get(k) == v}
            old = {**old, section: {**old[section], "adapter": {**table, **filled}}}
    task = old.get("task")
    if not isinstance(task, dict):
        return old
    task = dict(task)
    task.setdefault("data_root", "")  # written before task.data_root: none
    for key in ("checker", "hint"):
        if task.get(key) == {} and key in defaults and cfg["task"].get(key) == defaults[key]:
            task[key] = defaults[key]
    return {**old, "task": task}
