"""Starting or resuming a run: the run directory's self-description, then the loop."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from . import __version__, procs, ui
from .errors import UserError
from .experiment import Experiment, config_hash
from .loop import run_star
from .store import TMP_PREFIX, RunStore, atomic_write_bytes, atomic_write_json, clean_temporaries

log = structlog.get_logger("star_engine")


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


# Keys that may change when a run is resumed: they extend or observe it, they do not change its results.
RESUMABLE_CHANGES = {"experiment.iterations", "experiment.early_stop_patience", "experiment.output_dir"}


def _killed_at_start(root: Path) -> bool:
    """A run directory whose first start died before writing config.json: it holds only
    the files a start writes first (events.jsonl, experiment.toml) and temporaries."""
    names = {p.name for p in root.iterdir() if not p.name.startswith(TMP_PREFIX)}
    return "events.jsonl" in names and names <= {"events.jsonl", "experiment.toml"}


def prepare_run_dir(exp: Experiment, toml_path: Path) -> RunStore:
    """Create the run directory, or check that an existing one belongs to this experiment."""
    root = exp.run_dir
    # Several processes: all of them look at the folder before process 0 changes it.
    procs.CURRENT.sync("start")
    event_dir = root if procs.CURRENT.primary else None  # one event log, process 0's
    cfg_file = root / "config.json"
    describe = {"config_sha256": config_hash(exp.cfg), "star_engine": __version__,
                "plugins": exp.registry.requirements()}
    if cfg_file.exists():
        try:
            old = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{cfg_file}: unreadable ({e}); move the run directory away to start over") from None
        changed = [k for k in _diff(old, exp.cfg) if k not in RESUMABLE_CHANGES]
        if changed:
            raise UserError(f"{root}: holds a run of a different configuration (changed: {', '.join(changed)}); "
                            f"set experiment.output_dir to a new folder")
        removed = clean_temporaries(root)
        ui.configure_logging(event_dir)
        log.info("resume", run_dir=str(root), temporaries_removed=removed)
    elif root.exists() and any(root.iterdir()) and not _killed_at_start(root):
        raise UserError(f"{root}: exists and is not a star-engine run directory; choose another experiment.output_dir")
    else:
        clean_temporaries(root)  # a first start killed before config.json may have left some
        procs.primary_does("create the run directory", lambda: root.mkdir(parents=True, exist_ok=True))
        ui.configure_logging(event_dir)
        atomic_write_bytes(root / "experiment.toml", toml_path.read_bytes())
        log.info("start", run_dir=str(root))
    # The resolved config is rewritten on resume so a raised iteration count is recorded.
    atomic_write_json(cfg_file, exp.cfg)
    store = RunStore(root, describe)
    store.set_header(star_engine_version=__version__, config_sha256=describe["config_sha256"],
                     experiment=exp.cfg["experiment"]["name"], python=sys.version.split()[0],
                     platform=platform.platform(), plugins=exp.registry.describe(),
                     requirements=exp.registry.requirements(), backend=exp.backend.describe(),
                     finished=False)
    atomic_write_bytes(root / "requirements.txt", ("\n".join(exp.registry.requirements()) + "\n").encode())
    return store


def run(exp: Experiment, toml_path: Path) -> list[dict]:
    procs.configure(exp.backend)
    store = prepare_run_dir(exp, toml_path)
    exp.registry.notify("on_run_start", run_dir=store.root, config=exp.cfg)
    t0 = time.perf_counter()
    rows = run_star(exp, store)
    store.set_header(finished=True)
    log.info("run_finished", run_dir=str(store.root), seconds=round(time.perf_counter() - t0, 1))
    from .report import write_report  # matplotlib is imported only when a report is made

    write_report(store.root)
    exp.registry.notify("on_run_end", run_dir=store.root, metrics=rows)
    ui.console.print(ui.summary_table(rows))
    return rows
