"""``star-engine compare RUN... --out DIR``: many runs side by side, seeds grouped.

Runs whose ``config.json`` differ only by ``experiment.seed`` (and ``experiment.output_dir``,
``experiment.name``) form one group, shown as the mean over its runs ± the sample standard
deviation (n - 1 in the denominator; a group of one run shows its value alone), with n, the
runs that reached that iteration. The groups are named by the settings that differ between
them (the runs' ``config.json`` flattened to dotted keys). ``DIR/compare.md`` holds the tables
(accuracy per iteration and split; per class at the last iteration every run of a group
reached), ``DIR/compare.png`` the plot (``star_engine.report.compare_plot``). ``DIR`` is never a run
directory nor inside one: a comparison never touches the runs it reads.
"""

from __future__ import annotations

import glob
import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..rundir.fsio import in_the_way
from ..rundir.metrics import classes, natural
from .report import read_metrics
from ..rundir.fsio import atomic_write_bytes
from ..rundir.store import read_json_file

IGNORED = ("experiment.seed", "experiment.output_dir", "experiment.name")  # what runs of one group may differ by
LABEL_CHARS = 80  # a longer group name (many settings differ) is "group N"; the table of settings says which
CONFIG_MAX = 64 << 20


@dataclass(frozen=True)
class Run:
    path: Path
    settings: dict[str, str]  # config.json flattened: dotted key -> its value as JSON
    rows: list[dict]

    @property
    def seed(self) -> str:
        return self.settings.get("experiment.seed", "?")


@dataclass
class Group:
    label: str
    runs: list[Run]
    settings: dict[str, str] = field(default_factory=dict)  # the runs' settings less IGNORED


def flatten(node: Any, prefix: str = "") -> dict[str, str]:
    """A configuration as dotted keys and their values as JSON (lists whole)."""
    if isinstance(node, dict):
        out: dict[str, str] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix.rstrip("."): "{}"}
    return {prefix.rstrip("."): json.dumps(node, sort_keys=True)}


def expand(items: Sequence[str]) -> list[Path]:
    """The run directories: each item a path, or a glob (``runs/addition_seed*``) expanded here;
    each directory once, in the order given (a glob's matches sorted)."""
    out: list[Path] = []
    seen: set[Path] = set()
    for item in items:
        if re.search(r"[*?\[]", item):
            paths = [Path(p) for p in sorted(glob.glob(item))]
            if not paths:
                raise UserError(f"{item}: no run directory matches")
        else:
            paths = [Path(item)]
        for p in paths:
            if p.resolve() not in seen:
                seen.add(p.resolve())
                out.append(p)
    if not out:
        raise UserError("compare: needs at least one run directory")
    return out


def read_run(path: Path) -> Run:
    """A run directory's configuration and metrics; a folder that is not one is a ``UserError``."""
    if not path.is_dir():
        raise UserError(f"{path}: no such run directory")
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: not a run directory (no config.json)")
    cfg = read_json_file(path / "config.json", CONFIG_MAX, "config.json")
    if not isinstance(cfg, dict):
        raise UserError(f"{path / 'config.json'}: not a star-engine configuration (not a JSON object)")
    return Run(path, flatten(cfg), read_metrics(path))


def group(runs: Sequence[Run]) -> list[Group]:
    """Runs that differ only by ``IGNORED`` keys, together (in the order first seen), each group
    named by the settings that differ between the groups (its experiment's name when one group)."""
    groups: list[Group] = []
    for run in runs:
        settings = {k: v for k, v in run.settings.items() if k not in IGNORED}
        same = next((g for g in groups if g.settings == settings), None)
        if same is None:
            groups.append(Group("", [run], settings))
        else:
            same.runs.append(run)
    keys = differing(groups)
    short = [k.rsplit(".", 1)[-1] for k in keys]
    names = keys if len(", ".join(keys)) <= LABEL_CHARS or len(set(short)) < len(short) else short
    for i, g in enumerate(groups, 1):
        name = json.loads(g.runs[0].settings.get("experiment.name", '""')) or g.runs[0].path.name
        label = ", ".join(f"{n}={_plain(g.settings.get(k))}" for n, k in zip(names, keys)) if keys else str(name)
        g.label = label if len(label) <= LABEL_CHARS else f"group {i}"
    if len({g.label for g in groups}) < len(groups):
        for i, g in enumerate(groups, 1):
            g.label = f"group {i}"
    return groups


def differing(groups: Sequence[Group]) -> list[str]:
    """The dotted keys whose values are not the same in every group."""
    keys = sorted({k for g in groups for k in g.settings})
    return [k for k in keys if len({g.settings.get(k) for g in groups}) > 1]


def _plain(value: str | None) -> str:
    """A JSON value as the tables show it: strings without quotes, a missing key as "–"."""
    if value is None:
        return "–"
    v = json.loads(value)
    return v if isinstance(v, str) else value


def spread(values: Sequence[float]) -> tuple[float, float | None, int]:
    """(mean, sample standard deviation or None for one value, n)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None, len(values)


def cell(values: Sequence[float], size: int) -> str:
    """``mean ± sd`` in percent (of accuracies 0..1), with ``(n=k)`` when fewer than the group's ``size``."""
    if not values:
        return "–"
    m, sd, n = spread([100 * v for v in values])
    text = f"{m:.1f}" if sd is None else f"{m:.1f} ± {sd:.1f}"
    return text + (f" (n={n})" if n != size else "")


def splits(groups: Sequence[Group]) -> list[str]:
    """Every split the runs have: the evaluation splits in the order first seen, then train."""
    seen = list(dict.fromkeys(r["split"] for g in groups for run in g.runs for r in run.rows))
    return [s for s in seen if s != "train"] + (["train"] if "train" in seen else [])


def accuracy(run: Run, split: str, cls: str = "all") -> dict[int, float]:
    """The run's accuracy (0..1) by iteration, of ``split`` and class ``cls``."""
    return {r["iteration"]: r["accuracy"] for r in run.rows
            if r["split"] == split and r["class"] == cls and r["accuracy"] is not None}


def per_iteration(g: Group, split: str) -> dict[int, list[float]]:
    """The group's accuracies (one per run that has it) by iteration."""
    out: dict[int, list[float]] = {}
    for run in g.runs:
        for it, a in accuracy(run, split).items():
            out.setdefault(it, []).append(a)
    return dict(sorted(out.items()))


def last_iteration(g: Group, split: str) -> int | None:
    """The last iteration of ``split`` every run of the group reached (None: one has none)."""
    ends = [max(accuracy(run, split), default=None) for run in g.runs]
    return None if any(e is None for e in ends) else min(e for e in ends if e is not None)


def per_class(g: Group, split: str) -> tuple[int | None, dict[str, list[float]]]:
    """At ``last_iteration``: the group's accuracies per class ("all" included)."""
    last = last_iteration(g, split)
    out: dict[str, list[float]] = {}
    if last is None:
        return None, out
    for run in g.runs:
        for r in run.rows:
            if r["split"] == split and r["iteration"] == last and r["accuracy"] is not None:
                out.setdefault(r["class"], []).append(r["accuracy"])
    return last, out


def _head(groups: Sequence[Group], first: str, extra: Sequence[str] = ()) -> list[str]:
    names = [f"{g.label} (n={len(g.runs)}{extra[i] if extra else ''})" for i, g in enumerate(groups)]
    return ["| " + " | ".join([first, *[_md(n) for n in names]]) + " |", "| --- |" + " ---: |" * len(groups)]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(groups: Sequence[Group], image: str = "compare.png") -> str:
    """``compare.md``: the groups, the settings that differ, accuracy per iteration and split,
    per class at the last iteration."""
    n_runs = sum(len(g.runs) for g in groups)
    lines = [f"# Comparison of {n_runs} run{'s' if n_runs > 1 else ''} in {len(groups)} "
             f"group{'s' if len(groups) > 1 else ''}", "", f"![accuracy]({image})", "",
             "Each group's runs differ only by experiment.seed (and their folder and name). A cell is the "
             "mean over the group's runs ± the sample standard deviation (n - 1), in percent; n is the number "
             "of runs, given in a cell when fewer of them reached that iteration.", "",
             "## Groups", "", "| group | runs | seeds |", "| --- | --- | --- |"]
    for g in groups:
        lines.append(f"| {_md(g.label)} | {_md(', '.join(str(r.path) for r in g.runs))} | "
                     f"{', '.join(_plain(r.seed) for r in g.runs)} |")
    keys = differing(groups)
    if keys:
        lines += ["", "## Settings that differ between the groups", "", *_head(groups, "key")]
        lines += [f"| {k} | " + " | ".join(_md(_plain(g.settings.get(k))) for g in groups) + " |" for k in keys]
    for split in splits(groups):
        its = sorted({it for g in groups for it in per_iteration(g, split)})
        lines += ["", f"## {split} accuracy (%) per iteration", "", *_head(groups, "iteration")]
        for it in its:
            lines.append(f"| {it} | " + " | ".join(cell(per_iteration(g, split).get(it, []), len(g.runs))
                                                   for g in groups) + " |")
    for split in (s for s in splits(groups) if s != "train"):
        table = [per_class(g, split) for g in groups]
        cls = sorted({c for _, by in table for c in by if c != "all"}, key=natural)
        if not cls:
            continue
        lines += ["", f"## {split} accuracy (%) per class at the last iteration", "",
                  "The last iteration every run of the group reached, given in the header.", "",
                  *_head(groups, "class", [f", iteration {last}" for last, _ in table])]
        for c in [*cls, "all"]:
            lines.append(f"| {_md(c)} | " + " | ".join(cell(by.get(c, []), len(g.runs))
                                                       for g, (_, by) in zip(groups, table)) + " |")
    return "\n".join(lines) + "\n"


def summary(groups: Sequence[Group]) -> list[str]:
    """What the command prints: each group with its runs and its last accuracy, and the
    settings that differ between the groups."""
    split = next(iter(splits(groups)), "dev")
    out = [f"{sum(len(g.runs) for g in groups)} runs in {len(groups)} groups (mean ± sample standard deviation "
           f"over a group's runs, n runs):"]
    for g in groups:
        last = last_iteration(g, split)
        final = "" if last is None else f": {split} {cell(per_iteration(g, split)[last], len(g.runs))}% at " \
                                        f"iteration {last}"
        out.append(f"  {g.label} (n={len(g.runs)}, seeds {', '.join(_plain(r.seed) for r in g.runs)}){final}")
    keys = differing(groups)
    out.append("settings that differ between the groups:" if keys else "the groups' settings are the same")
    out += [f"  {k}: " + " | ".join(_plain(g.settings.get(k)) for g in groups) for k in keys]
    return out


def check_out(out: Path, runs: Sequence[Path]) -> None:
    """``--out`` is a folder (or none yet) outside every run directory."""
    target = Path(out).resolve()
    for d in (target, *target.parents):
        if (d / "config.json").is_file() or any(d == r.resolve() for r in runs):
            raise UserError(f"--out {out}: {'is' if d == target else 'lies inside'} the run directory {d}; "
                            f"compare writes outside the runs (e.g. --out comparisons/NAME)")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a folder")
    for name in ("compare.md", "compare.png"):
        if in_the_way(out / name):
            raise UserError(f"{out / name}: exists and is not a file (compare writes one there); move it away")


@dataclass(frozen=True)
class Comparison:
    """What ``write`` wrote (``compare.md``; ``compare.png`` beside it) and what to print."""

    path: Path
    groups: list[Group]
    lines: list[str]


def write(items: Sequence[str], out: Path) -> Comparison:
    """Read the runs of ``items`` (paths or globs), group them, write ``out/compare.md`` and
    ``out/compare.png``. Everything is read and checked before anything is written."""
    paths = expand(items)
    check_out(out, paths)
    groups = group([read_run(p) for p in paths])
    from .compare_plot import Bars, Curve, plot  # matplotlib is imported only to draw

    curves = {s: [Curve(g.label, [accuracy(r, s) for r in g.runs], per_iteration(g, s)) for g in groups]
              for s in splits(groups)}
    bars = {s: [Bars(g.label, *per_class(g, s)) for g in groups] for s in splits(groups)
            if s != "train" and any(classes_of(g, s) for g in groups)}
    png = plot(curves, bars)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "compare.png", png)
    atomic_write_bytes(out / "compare.md", markdown(groups).encode())
    return Comparison(out / "compare.md", groups, summary(groups))


def classes_of(g: Group, split: str) -> list[str]:
    """The classes (other than "all") of ``split`` in any run of the group."""
    return sorted({c for run in g.runs for c in classes(run.rows, split)}, key=natural)
