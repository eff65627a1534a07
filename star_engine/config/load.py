"""An experiment's configuration: the typed ``Config`` (its sections are in
:mod:`star_engine.config.settings`), and how an experiment TOML file becomes one: parsing, ``--set``
overrides, schema validation, defaults.

Every error names the file and either ``line:col`` (syntax) or the dotted key
path (schema), and is raised as :class:`UserError` (exit code 2). The schema is ``Config``'s
(``SCHEMA``); ``experiment.build`` makes the ``Config`` from the dict ``load_experiment``
returns (the resolved configuration, ``config.json``).
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from . import dataroot, effects, smoke as _smoke
from .datafiles import not_utf8, read_capped
from .. import ui
from ..errors import PluginError, UserError
from .registry import Registry, check_options, close_matches
from .schema import Option, describe_value, validate
from .settings import (BaseTraining, EvaluationSection, ExperimentSection, Generation, Rationalization, Section,
                       TaskSection, Training, Verifier)


@dataclass(frozen=True, kw_only=True)
class Config(Section):
    """A whole experiment, validated and resolved (``samples_per_question``, ``pass_k`` and the
    task's default checker filled in); ``as_dict()`` is what ``config.json`` holds."""

    experiment: ExperimentSection
    task: TaskSection
    generation: Generation = field(default_factory=Generation)
    rationalization: Rationalization = field(default_factory=Rationalization)
    base_training: BaseTraining = field(default_factory=BaseTraining)
    training: Training = field(default_factory=Training)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    verifier: Verifier = field(default_factory=Verifier)
    model: dict  # the backend's table: its factory's options (``schema.declared``)


# ``[sweep]``: ``"dotted.key" = [values]``, one run per combination (``star_engine.run.sweep``). Not a
# setting of one run: ``load_experiment`` checks that it is a table and leaves it out of the
# configuration it returns (``config.json``, the run directory's identity, never holds it).
SWEEP = Option("sweep", dict[str, list], (), {})
SCHEMA: dict[str, Any] = {**Config.schema(), "sweep": SWEEP}

_LINECOL = re.compile(r"\(at line (\d+), column (\d+)\)")


def _validate(data: dict[str, Any], table: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``data`` checked against ``table`` (a section's ``schema()``: options, and nested
    sections' tables) by ``schema.validate``; the error carries its key (``UserError.key``), whose
    origin ``load_experiment`` puts in front (``Origins.place``)."""
    options = {k: (v if isinstance(v, Option) else Option(k, dict, (), {})) for k, v in table.items()}

    def nested(name: str) -> dict[str, Option] | None:
        return table[name] if isinstance(table.get(name), dict) else None

    return validate(data, options, prefix, nested=nested)


def check_table(data: Any, table: dict[str, Any], key: str) -> dict[str, Any]:
    """A plugin's own table (``data``, at TOML key ``key``) checked against ``table`` (a typed
    section's ``schema()``), its defaults filled in: the experiment file's rules and messages.
    The error carries its key; the CLI's ``Origins.blame`` puts the file or the ``--set`` in front."""
    if not isinstance(data, dict):
        raise UserError(f"{key}: expected a table, got {describe_value(data)}", key=key)
    return _validate(data, table, key + ".")


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], value); the value is read as TOML, else as a string."""
    shown = not_utf8(item)  # bytes the command line had that are not UTF-8 (surrogate escapes)
    if shown is not None:
        raise UserError(f"--set {shown}: not valid UTF-8")
    if "=" not in item:
        raise UserError(f"--set {item}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set {item}: bad key '{key}'")
    try:
        doc = tomllib.loads(f"v = {raw}")
        value = doc["v"] if list(doc) == ["v"] else raw  # "1\n[x]" is not one value: a string
    except (ValueError, RecursionError):  # TOMLDecodeError, or an integer of >4300 digits
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> None:
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise UserError(f"--set {item}: '{p}' is not a table")
            node = child
        node[parts[-1]] = value


def _unindexed(key: str) -> str:
    """``task.filters[1].max_chars`` -> ``task.filters.max_chars``: keys as ``Origins`` compares them."""
    return re.sub(r"\[\d+\]", "", key)


class Origins:
    """Where the value of a dotted key came from: the TOML file, or the ``--set`` that gave it."""

    def __init__(self, path: Path | str, overrides: list[str] | None = None):
        self.path = str(path)
        self.items = [(_unindexed(".".join(p.strip() for p in item.split("=", 1)[0].strip().split("."))), item)
                      for item in overrides or [] if "=" in item]

    def __call__(self, key: str) -> str:
        key = _unindexed(key)
        for okey, item in reversed(self.items):  # the last --set of a key wins
            if key == okey or key.startswith(okey + "."):
                return f"--set {item}"
        inner = [item for okey, item in self.items if okey.startswith(key + ".")]
        return f"{self.path} (with --set {', --set '.join(inner)})" if inner else self.path

    def place(self, error: UserError) -> UserError:
        """``error`` with its origin in front (``blame``), once: an error placed already is returned as is."""
        if error.placed:
            return error
        out = type(error)(self.blame(error), key=error.key)
        out.placed = True
        return out

    def blame(self, error: UserError) -> str:
        """The error's message with its origin in front: an error that carries a configuration
        key (``UserError.key``) gets that key's origin; one whose message already names a file
        or its origin (``/abs``, ``file:line``, ``--set``) is left alone; any other gets the TOML file."""
        message = str(error)
        if error.key is not None and error.key.split(".")[0].split("[")[0] in SCHEMA:
            return f"{self(error.key)}: {message}"
        if message.startswith(("/", "--set ", "--limit")) or re.match(r"^[^\s:]+:\d+", message):
            return message
        return f"{self.path}: {message}"


TOML_MAX = 16 << 20  # an experiment file is a few KiB; /dev/zero or a runaway pipe is not one


def load_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise UserError(f"{path}: no such file")
    data = read_capped(path, TOML_MAX)
    if data.startswith(b"\xef\xbb\xbf"):  # a byte-order mark some editors write: not TOML, but harmless
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(f"{path}:{line}:{col}: not valid UTF-8 (byte 0x{data[e.start]:02x})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _LINECOL.search(msg)
        where = f"{path}:{m.group(1)}:{m.group(2)}" if m else str(path)
        raise UserError(f"{where}: {_LINECOL.sub('', msg).strip()}") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply (arrays or inline tables)") from None
    except ValueError as e:  # tomllib lets int() refuse an integer of more than 4300 digits
        raise UserError(f"{path}: {e}") from None


NAME_MAX = 255  # bytes in one file or folder name: ext4, xfs, btrfs, tmpfs (NTFS: 255 UTF-16 units)


def _resolve(base: Path, value: str, key: str, keep_absolute: bool = False) -> str:
    """An absolute path for ``value`` (relative to ``base``), refusing what no file can be named."""
    if "\0" in value:
        raise UserError(f"{key}: a path cannot contain a NUL character", key=key)
    if keep_absolute and Path(value).is_absolute():
        return value
    try:
        return str((base / value).resolve())
    except (OSError, RuntimeError, ValueError) as e:
        raise UserError(f"{key}: not a usable path ({e})", key=key) from None


def _resolve_paths(node: Any, base: Path, key: str) -> Any:
    """Option values under keys ending in _file/_path/_dir are relative to the TOML file."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if isinstance(v, str) and v and k.endswith(("_file", "_path", "_dir")):
                out[k] = _resolve(base, v, f"{key}.{k}", keep_absolute=True)
            else:
                out[k] = _resolve_paths(v, base, f"{key}.{k}")
        return out
    if isinstance(node, list):
        return [_resolve_paths(x, base, f"{key}[{i}]") for i, x in enumerate(node)]
    return node


def normalize_component(value: Any) -> dict[str, Any]:
    """A component reference as ``{"name": ..., **options}``."""
    return {"name": value} if isinstance(value, str) else dict(value)


def load_experiment(path: Path, overrides: list[str] | None = None, limit: int | None = None,
                    registry: Registry | None = None, smoke: bool = False,
                    member: Callable[[dict[str, Any]], None] | None = None) -> Config:
    """Parse, override, validate and resolve one experiment file into the typed ``Config`` (the
    backend's ``[*.optimizer]`` tables as its declared objects). An error names its key, and the
    file or the ``--set`` that gave the faulty value in front (``Origins.place``, here once).
    ``registry`` (default: a new one) finds the backend whose declarations the optimizer and
    adapter tables are checked by. ``smoke`` (``--smoke``, or ``experiment.smoke = true``): the
    file's values made a smoke run's (``star_engine.config.smoke``) before the overrides apply.
    ``member``: one run of a sweep (``sweep.Member.apply``): its values and folder written over
    the data after the overrides. The ``[sweep]`` table is checked to be a table and left out."""
    overrides = overrides or []
    origins = Origins(path, overrides)
    try:
        data = load_toml(path)
        if smoke or _smoke.requested(data, overrides, apply_overrides):
            _check_as_written(data, overrides, registry)  # what the smoke settings replace, checked first
            _smoke.apply(data, limit)
        apply_overrides(data, overrides)
        if member is not None:
            member(data)
        if limit is not None:
            data.setdefault("experiment", {})["limit"] = limit
        cfg = _validate(data, SCHEMA, "")
        cfg.pop("sweep")  # the sweep's members (star_engine.run.sweep), not this run's setting
        pointless = effects.pointless(cfg, SCHEMA)  # refused once every key is checked (below)
        base = path.resolve().parent
        _resolve_task(cfg["task"], cfg["evaluation"]["splits"], base, origins("task.data_root").startswith("--set "))
        _resolve_components(cfg, base)
        _resolve_output(cfg["experiment"], base)
        _check_evaluation(cfg["evaluation"], cfg["generation"])
        _backend_tables(cfg, registry if registry is not None else Registry())
        for line in effects.refuse(pointless, origins, lambda key: effects.switched(data, key, origins)):
            ui.note(line)  # an ablation: the settings it makes pointless, left unused
        _check_verifier(cfg)
        return Config.from_dict(cfg)
    except UserError as e:
        raise origins.place(e) from None


def _resolve_task(task: dict[str, Any], splits: list[str], base: Path, root_from_set: bool) -> None:
    """The data root, the split files and the task's file options as absolute paths: relative to
    the data root where one is set (a ``--set`` one: to the working directory), else to the file."""
    try:
        root, _ = dataroot.resolve_root(task["data_root"], base, root_from_set)
    except UserError as e:
        raise UserError(str(e), key="task.data_root") from None
    task["data_root"] = str(root) if root is not None else ""
    files = root or base
    used = [task["train_split"], *splits]  # task.train_split: "train" unless set
    for split, v in task["data"].items():
        key = f"task.data.{split}"
        if split not in used:
            trains = "train" if used[0] == "train" else f"task.train_split {used[0]!r}"
            raise UserError(f"{key}: this run reads no split '{split}' (it reads {trains} and evaluation.splits: "
                            f"{', '.join(used[1:]) or 'none'}){close_matches(split, used)}", key=key)
        if not isinstance(v, str):
            raise UserError(f"{key}: expected a path string, got {describe_value(v)}", key=key)
    task["data"] = {k: _resolve(files, v, f"task.data.{k}") for k, v in task["data"].items()}
    task["options"] = _resolve_paths(task["options"], files, "task.options")


def _resolve_components(cfg: dict[str, Any], base: Path) -> None:
    """Every component reference as ``{"name": ..., **options}`` (``""``: none, as ``{}``), its
    file options absolute; ``[model]`` names its backend."""
    task, generation = cfg["task"], cfg["generation"]
    task["filters"] = [_resolve_paths(normalize_component(f), base, f"task.filters[{i}]")
                       for i, f in enumerate(task["filters"])]
    for key in ("checker", "reward", "hint"):
        task[key] = _resolve_paths(normalize_component(task[key]), base, f"task.{key}") if task[key] else {}
    cfg["training"]["schedule"] = _resolve_paths(normalize_component(cfg["training"]["schedule"]), base,
                                                 "training.schedule")
    cfg["evaluation"]["checkers"] = [_resolve_paths(normalize_component(c), base, f"evaluation.checkers[{i}]")
                                     for i, c in enumerate(cfg["evaluation"]["checkers"])]
    for key in ("sampler", "tuner"):  # "": drawn uniformly / sampled at generation.temperature, no plugin
        generation[key] = (_resolve_paths(normalize_component(generation[key]), base, f"generation.{key}")
                           if generation[key] else {})
    if not isinstance(cfg["model"].get("backend"), str):
        raise UserError("missing required key 'model.backend' (a backend name)", key="model.backend")
    cfg["model"] = _resolve_paths(cfg["model"], base, "model")


def _resolve_output(experiment: dict[str, Any], base: Path) -> None:
    """The run's folder: ``output_dir`` (relative to the file) or ``runs/<name>`` beside it."""
    for key, other in (("expected_minutes", "expected_gflops"), ("expected_gflops", "expected_minutes")):
        if experiment[key] and not experiment[other]:
            raise UserError(f"experiment.{key}: needs experiment.{other} (the time was measured on a CPU of that "
                            f"many fp32 GFLOP/s; the estimate scales it to this one)", key=f"experiment.{key}")
    name = experiment["name"]
    if not experiment["output_dir"] and ".." in Path(name).parts:
        raise UserError(f"experiment.name: {name!r} names the run's folder runs/{name} (experiment.output_dir is "
                        f"not set), which must lie inside runs/; set experiment.output_dir or choose another name",
                        key="experiment.name")
    out = experiment["output_dir"] or f"runs/{name}"
    key = "experiment.output_dir" if experiment["output_dir"] else "experiment.name"
    if "\0" in out:
        raise UserError(f"{key}: a path cannot contain a NUL character", key=key)
    longest = max((len(os.fsencode(part)) for part in Path(out).parts), default=0)  # bytes, not characters
    if longest > NAME_MAX:
        raise UserError(f"{key}: a folder name of {longest} bytes in the run directory's path; file systems allow "
                        f"at most {NAME_MAX}", key=key)
    experiment["output_dir"] = _resolve(base, out, key)  # relative to the file, as every path in it


def _check_evaluation(evaluation: dict[str, Any], generation: dict[str, Any]) -> None:
    if not evaluation["splits"]:
        raise UserError("evaluation.splits: needs at least one split", key="evaluation.splits")
    twice = sorted({s for s in evaluation["splits"] if evaluation["splits"].count(s) > 1})
    if twice:
        raise UserError(f"evaluation.splits: {', '.join(map(repr, twice))} listed more than once (each split is "
                        f"evaluated once)", key="evaluation.splits")
    EvaluationSection.resolve_inherited(evaluation, generation)


def _check_as_written(data: dict[str, Any], overrides: list[str], registry: Registry | None) -> None:
    """``--smoke``: the experiment as written (the file and its ``--set``s) passes the checks a run
    of it would pass before the smoke settings replace some of its values (``[model]``,
    ``experiment.iterations``): every key and type, and the ``[model]`` table against the
    backend's options."""
    written = copy.deepcopy(data)
    apply_overrides(written, overrides)
    cfg = _validate(written, SCHEMA, "")
    model = cfg.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("backend"), str):
        return  # named by the full load that follows
    try:
        factory = (registry if registry is not None else Registry()).get("backend", model["backend"],
                                                                          "model.backend").factory
    except PluginError:
        return  # an unknown or broken backend: named when the experiment is built
    try:
        check_options(factory, {k: v for k, v in model.items() if k != "backend"}, "model",
                      f"backend '{model['backend']}'")
    except UserError as e:
        raise UserError(f"{e} (checked as written: --smoke replaces [model])", key=e.key or "model") from None


def _check_verifier(cfg: dict[str, Any]) -> None:
    """A V-STaR verifier that would have nothing to learn from, or no iteration to be trained in:
    its D_VER is the samples the iterations collect (``star_engine.run.verifying``)."""
    v = cfg["verifier"]
    if not v["enabled"] or v["schedule"] == "each_iteration":
        return
    if cfg["training"]["source"] == "gold":
        raise UserError(f"verifier.schedule: {v['schedule']!r} trains on the samples the iterations collect, and "
                        f"training.source = \"gold\" samples none; set verifier.enabled = false or training.source "
                        f"= \"generated\"", key="verifier.schedule")
    for stop in ("early_stop_patience", "collapse_patience"):
        if v["schedule"] == "final" and cfg["experiment"].get(stop):
            raise UserError(f"verifier.schedule: \"final\" trains its verifier after the last iteration, which "
                            f"experiment.{stop} = {cfg['experiment'][stop]} may never reach; use verifier.schedule "
                            f"= \"cumulative\" (a verifier at each evaluating iteration) or set experiment.{stop} = 0",
                            key="verifier.schedule")


TRAINING_SECTIONS = ("base_training", "training", "verifier")


def _backend_tables(cfg: dict[str, Any], registry: Registry) -> None:
    """The tables the backend declares, checked once and made its objects, the objects the
    training jobs carry (``config.json`` records them completed with their defaults: what
    trains). An ``adapter`` table names a kind the backend trains (``Backend.adapter_kinds``) and
    becomes an instance of that kind's declaration (``Backend.adapter_tables``, where the backend
    has one; what needs the model, the backend checks in ``validate_run``); each
    ``[*.optimizer]`` table becomes an instance of the backend's ``optimizer_table``. Left as
    written when the backend declares none, or is unknown or broken (``experiment.build`` then
    says so)."""
    try:
        factory = registry.get("backend", cfg["model"]["backend"], "model.backend").factory
    except PluginError:
        return
    kinds = tuple(getattr(factory, "adapter_kinds", ()))
    adapters = getattr(factory, "adapter_tables", None) or {}
    for section in TRAINING_SECTIONS:
        adapter = cfg[section]["adapter"]
        if adapter and adapter.get("kind") not in kinds:
            key = f"{section}.adapter" + (".kind" if kinds else "")
            raise UserError(f"{key}: " + (
                f"must be one of {list(kinds)}, got {adapter.get('kind')!r}" if kinds else
                f"backend {cfg['model']['backend']!r} trains no adapters (every weight trains); remove the table"),
                key=key)
        if adapter and adapter["kind"] in adapters:
            cfg[section]["adapter"] = _declared(adapters[adapter["kind"]], adapter, f"{section}.adapter")
    table = getattr(factory, "optimizer_table", None)
    if table is None:
        return
    for section in TRAINING_SECTIONS:
        cfg[section]["optimizer"] = _declared(table, cfg[section]["optimizer"], f"{section}.optimizer")


def _declared(table: Any, data: dict[str, Any], key: str) -> Any:
    """``data`` checked against a backend's declaration ``table`` (a ``Section``: its object;
    else any class with ``schema()``: the checked table)."""
    checked = _validate(data, table.schema(), key + ".")
    return table.from_dict(checked) if isinstance(table, type) and issubclass(table, Section) else checked
