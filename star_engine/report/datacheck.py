"""``star-engine data check [EXPERIMENT]``: the files an experiment (or every installed task)
expects under the data root (``star_engine.config.dataroot``), each present, missing or different."""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable

from ..config.load import load_experiment
from ..config.dataroot import ENV, Status, absolute, check, experiment_files, known_files, report, status
from ..errors import UserError
from ..config.registry import Registry


def command(experiment: Path | None, overrides: list[str], root: Path | None,
            out: Callable[[str], None] = print) -> int:
    """``star-engine data check [EXPERIMENT] [--set ...] [--root DIR]``: the files ``experiment``
    reads (each ``task.data`` split and file option), or without one every file the installed
    tasks know under ``root`` (else ``STAR_ENGINE_DATA``), each present, missing or different
    (sha256); reads only. Bad input (exit 2): a missing or different file of the experiment, a
    different known file, a missing file of a task that has some of its files there (a task with
    none of them is not set up there: said, no failure), two tasks knowing one file differently."""
    registry = Registry()
    known, conflicts = known_files(registry)
    if experiment is not None:
        if root is not None:
            raise UserError("--root: only without an experiment (the experiment's task.data_root, STAR_ENGINE_DATA "
                            "or --set task.data_root=... say where its data is)")
        cfg = load_experiment(experiment, overrides, None, registry)
        found = Path(cfg.task.data_root) if cfg.task.data_root else None
        env = os.environ.get(ENV, "")
        where = (ENV if env and found == absolute(Path.cwd(), env, ENV)
                 else f"task.data_root of {experiment}" if found else "")
        statuses = check(experiment_files(cfg), found, known)
        failed = [s for s in statuses if s.state in ("missing", "different")]
    else:
        if overrides:
            raise UserError("--set: only with an experiment")
        env = os.environ.get(ENV, "")
        if root is None and not env:
            raise UserError(f"data check: say which data: an experiment file, --root DIR, or the environment "
                            f"variable {ENV}")
        found = absolute(Path.cwd(), str(root), "--root") if root is not None else absolute(Path.cwd(), env, ENV)
        where = "--root" if root is not None else ENV
        if not found.is_dir():
            raise UserError(f"{where}: {found} is not a folder" + ("" if found.exists() else " (no such path)"))
        statuses = [status(f"task {task}", found / rel, found, known) for rel, (task, _) in sorted(known.items())]
        failed = [s for s in statuses if s.state == "different"] + incomplete(statuses)
    if statuses:
        report(statuses, found, where, out)
    for line in conflicts:
        out(f"  conflict  {line}")
    counts = {state: sum(s.state == state for s in statuses) for state in ("ok", "present", "missing", "different")}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    if experiment is None:
        for line in task_lines(statuses):
            out(line)
    if failed or conflicts:
        raise UserError(f"data check: {summary or 'no files'}" + (f", {len(conflicts)} conflicting" if conflicts else "")
                        + "; README.md 'Getting the data' says where each file comes from and where it goes")
    out(f"data check: {summary}" if summary else "data check: nothing to check (" + (
        "the experiment names no data file: its task makes its data)" if experiment is not None else
        "no installed task knows a data file)"))
    return 0


def _by_task(statuses: list[Status]) -> dict[str, list[Status]]:
    tasks: dict[str, list[Status]] = {}
    for s in statuses:
        tasks.setdefault(s.key, []).append(s)
    return tasks


def incomplete(statuses: list[Status]) -> list[Status]:
    """The missing files of each task that has some of its files under the root but not all
    (a task with none of them is not set up there: no failure, ``task_lines`` says so)."""
    out: list[Status] = []
    for files in _by_task(statuses).values():
        missing = [s for s in files if s.state == "missing"]
        if missing and len(missing) < len(files):
            out += missing
    return out


def task_lines(statuses: list[Status]) -> list[str]:
    """A line per task: complete, not set up here (none of its files), or incomplete."""
    lines = []
    for key, files in _by_task(statuses).items():
        missing = sum(s.state == "missing" for s in files)
        state = ("complete" if not missing else "not set up here (none of its files)" if missing == len(files)
                 else f"incomplete: {missing} of its {len(files)} files missing")
        lines.append(f"{key}: {state}")
    return lines
