"""Many runs of one experiment file: ``run FILE --seeds 0,1,2`` and a ``[sweep]`` table.

``[sweep]`` maps dotted configuration keys to lists of values (``"generation.temperature" =
[0.5, 0.7]``; a nested table, ``generation.temperature = [...]`` written under ``[sweep]``, reads
the same); the runs are the product of the lists, in the file's order, times the ``--seeds``
(``experiment.seed``, innermost). Each run, a *member*, is the file with its values written over
it after the ``--set`` overrides, in its own run directory: the file's ``output_dir`` (or
``runs/<name>``) with ``_key=value`` per swept key and ``_seedN`` appended (values sanitised:
``runs/addition_generation.temperature=0.5_seed1``). Every member is checked (``validate``'s
checks, the run directory's included) before the first one runs; they run one after the other,
and rerunning the command resumes the unfinished ones (each run directory resumes) and skips
those finished with the same configuration.

``config.json`` holds no ``[sweep]``: a member's is that of a single run with its values.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..config.schema import COMPONENT, Option, close_matches

SEEDS_HELP = "comma-separated whole numbers >= 0, e.g. --seeds 0,1,2"
VALUE_CHARS = 40  # a longer value is cut and given a hash in the folder's name


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2`` as the seeds, each once; a bad list is a ``UserError``."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() and p.isascii() and len(p) < 19 for p in parts):
        raise UserError(f"--seeds {text}: expected {SEEDS_HELP}")
    seeds = [int(p) for p in parts]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise UserError(f"--seeds {text}: {', '.join(map(str, twice))} given more than once")
    return seeds


def shown(value: Any) -> str:
    """A value as a folder name may hold it: letters, digits and ``.+-`` (a long one cut, with a
    hash of the whole value so that two long values stay apart)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, (int, float)):
        return repr(value)  # digits, "." "-" "+" "e": a negative number keeps its sign
    else:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "-"
    if len(text) > VALUE_CHARS or text in (".", ".."):
        digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:8]
        text = f"{text[: VALUE_CHARS - 9]}-{digest}"
    return text


@dataclass(frozen=True)
class Member:
    """One run of a sweep: ``values`` (dotted key, value) written over the file's data, and
    ``label``, what its run directory's name gets appended (after ``_``)."""

    values: tuple[tuple[str, Any], ...]
    label: str

    def apply(self, data: dict[str, Any]) -> None:
        """Write the member's values and its run directory over the file's ``data`` (in place;
        ``config.load_experiment`` calls it after the overrides, before validating)."""
        for key, value in self.values:
            node = data
            parts = key.split(".")
            for i, part in enumerate(parts[:-1]):
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    raise UserError(f"[sweep] {key}: '{'.'.join(parts[: i + 1])}' is not a table here",
                                    key=f"sweep.{key}")
                node = child
            node[parts[-1]] = json.loads(json.dumps(value))  # a copy: no member shares a table with another
        exp = data.setdefault("experiment", {})
        if isinstance(exp, dict):  # (a malformed file: validation names it)
            out = exp.get("output_dir") or f"runs/{exp.get('name', 'experiment')}"
            if isinstance(out, str):
                exp["output_dir"] = f"{out.rstrip('/')}_{self.label}"


def _flat(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``[sweep]``'s (dotted key, values), nested tables read as dotted keys."""
    out: list[tuple[str, Any]] = []
    for k, v in table.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def _known_keys() -> list[str]:
    from ..config.load import SCHEMA

    out = []
    for name, node in SCHEMA.items():
        if name != "sweep":
            out += [name] + ([f"{name}.{k}" for k in node] if isinstance(node, dict) else [])
    return out


def check_key(key: str) -> None:
    """A swept key names a key of the configuration: a section's option, or a key inside a
    plugin's table (``model.lr``, ``task.options.n``: checked when each member is built)."""
    from ..config.load import SCHEMA

    parts = key.split(".")
    node: Any = SCHEMA
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if isinstance(node, dict):
            if part not in node or here == "sweep":
                raise UserError(f"[sweep] {key}: no such configuration key{close_matches(key, _known_keys())}",
                                key=f"sweep.{key}")
            node = node[part]
        elif isinstance(node, Option) and (node.type is dict or COMPONENT in node.constraints):
            return  # a plugin's options: its factory checks them when the member is built
        else:
            raise UserError(f"[sweep] {key}: {'.'.join(parts[:i])} is a single value, not a table",
                            key=f"sweep.{key}")
    if isinstance(node, dict):
        raise UserError(f"[sweep] {key}: a whole section; sweep its keys ({', '.join(list(node)[:4])}, ...)",
                        key=f"sweep.{key}")


def sweep_table(data: dict[str, Any]) -> list[tuple[str, list]]:
    """The file's ``[sweep]`` (after ``--set``) checked: known keys, each a non-empty list of
    distinct values."""
    table = data.get("sweep", {})
    if not isinstance(table, dict):
        raise UserError("sweep: expected a table of \"dotted.key\" = [values]", key="sweep")
    out = []
    for key, values in _flat(table):
        check_key(key)
        if key == "experiment.output_dir":
            raise UserError("[sweep] experiment.output_dir: each run's folder is named after its values; sweep "
                            "other keys", key="sweep.experiment.output_dir")
        if not isinstance(values, list) or not values:
            raise UserError(f"[sweep] {key}: expected a non-empty list of values, got {json.dumps(values)}",
                            key=f"sweep.{key}")
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise UserError(f"[sweep] {key}: {json.dumps(twice[0])} listed more than once", key=f"sweep.{key}")
        out.append((key, values))
    return out


def plan(path: Path, overrides: Sequence[str], seeds: str | None) -> list[Member] | None:
    """The members of the file's ``[sweep]`` and ``--seeds`` (None: neither, a single run)."""
    from ..config.load import apply_overrides, load_toml, parse_override

    data = load_toml(path)
    apply_overrides(data, list(overrides))
    axes: list[tuple[str, list]] = sweep_table(data)
    if seeds is not None:
        if any(k == "experiment.seed" for k, _ in axes):
            raise UserError(f"--seeds {seeds}: [sweep] in {path} sweeps experiment.seed already; use one of them")
        axes.append(("experiment.seed", parse_seeds(seeds)))
    if not axes:
        return None
    swept = {k for k, _ in axes}
    for item in overrides:
        key = ".".join(parse_override(item)[0])
        if any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in swept):
            raise UserError(f"--set {item}: {key} is swept (" + ("--seeds" if key == "experiment.seed" and seeds
                            is not None else f"[sweep] in {path}") + "); remove one of them")
    members: list[Member] = []
    folders: dict[str, tuple[tuple[str, Any], ...]] = {}
    for combo in itertools.product(*(values for _, values in axes)):
        values = tuple(zip((k for k, _ in axes), combo))
        label = "_".join(f"seed{v}" if k == "experiment.seed" and seeds is not None else f"{k}={shown(v)}"
                         for k, v in values)
        if label in folders:
            raise UserError(f"[sweep] in {path}: {_said(folders[label])} and {_said(values)} would share the run "
                            f"directory suffix {label!r}")
        folders[label] = values
        members.append(Member(values, label))
    return members


def _said(values: Sequence[tuple[str, Any]]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in values)


def load(path: Path, overrides: Sequence[str], limit: int | None, smoke: bool, member: Member,
         load_data: bool = True) -> tuple[Any, Any]:
    """A member's experiment, built, and its run directory as ``runner.preflight`` finds it: every
    check ``run`` makes before it writes. An error says which member."""
    from ..config.load import Origins, load_experiment
    from .experiment import build
    from ..config.registry import Registry
    from .runner import preflight

    registry = Registry()
    try:
        cfg = load_experiment(path, list(overrides), limit, registry, smoke=smoke, member=member.apply)
        try:
            exp = build(cfg, registry, load_data=load_data)
            return exp, preflight(exp)
        except UserError as e:
            raise Origins(path, list(overrides)).place(e) from None
    except UserError as e:
        raise type(e)(f"{e} (the run {member.label} of the sweep)", key=e.key) from None


def _finished(exp: Any, state: Any) -> bool:
    """The run directory holds this very configuration, run to its end: nothing to do."""
    from ..rundir.layout import diff
    from ..rundir.store import read_json_file

    if not (state.resume and (state.manifest or {}).get("finished") is True):
        return False
    old = read_json_file(state.root / "config.json", 64 << 20, "config.json")
    return not diff(old, json.loads(json.dumps(exp.config.as_dict())))


def check_all(path: Path, overrides: Sequence[str], limit: int | None, smoke: bool,
              members: Sequence[Member], load_data: bool = True) -> list[tuple[Member, Path, str]]:
    """Every member checked before any runs: (member, run directory, what a run would do:
    "new", "resumes", "finished")."""
    if limit is not None and limit < 1:
        raise UserError("--limit: must be >= 1")
    out = []
    for m in members:
        exp, state = load(path, overrides, limit, smoke, m, load_data)
        what = "finished" if _finished(exp, state) else "resumes" if state.resume else "new"
        out.append((m, exp.run_dir, what))
    return out


def compare_command(run_dirs: Sequence[Path], name: str) -> str:
    """The ``star-engine compare`` command that shows ``run_dirs`` together."""
    return " ".join(["star-engine compare", *(shlex.quote(str(d)) for d in run_dirs), "--out",
                     shlex.quote(f"comparisons/{name}")])


def run_all(path: Path, overrides: Sequence[str], limit: int | None, smoke: bool, members: Sequence[Member],
            quiet: bool) -> list[tuple[Path, str]]:
    """Check every member, then run them one after the other (a finished one is skipped);
    returns each run directory and what became of it."""
    from ..rundir import runlock
    from .. import ui
    from .runner import run

    checked = check_all(path, overrides, limit, smoke, members)
    done = []
    for i, (m, root, what) in enumerate(checked, 1):
        if what == "finished":
            done.append((root, "finished before; skipped"))
            continue
        if not quiet:
            print(f"run {i}/{len(checked)}: {m.label} in {root}", flush=True)
        exp, _ = load(path, overrides, limit, smoke, m)
        run(exp, path)
        ui.close_run_log()  # the next member's checks write to no run's event log
        runlock.release(exp.run_dir)  # finished: status says so while the next member runs
        done.append((root, "finished" if what == "new" else "resumed, finished"))
    return done
