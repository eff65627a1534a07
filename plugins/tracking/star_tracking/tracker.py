"""TensorBoard logging of a STaR run (one writer per run directory).

Scalars, all with the STaR iteration as their step (0 = the base model):

- ``accuracy/<split>/<class>``: every row of ``metrics.parquet`` with an accuracy
  (train rows are the unhinted generations; class ``<c>_r`` the hinted ones);
- ``rationales/kept/<class>``, ``rationales/rationalized/<class>``,
  ``rationales/correct/<class>``: the train rows' counts (``kept`` only for ``<c>_r``);
- ``train/steps``, ``train/tokens``, ``train/loss`` (mean of the last 10% of
  steps), ``train/coverage``, ``time/wall_seconds``;
- ``loss/iteration_<NNN>``: the loss curve of that iteration's fine-tuning, one
  point per optimizer step (1-based); ``loss/base_training`` for the base model.

``<run_dir>/tracking.json`` says whether tracking is on (and why not), where the
event files are, and which iterations they hold: a resumed run, for which the
core replays ``on_iteration_end`` of finished iterations, does not log those twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

import structlog

from star_engine.helpers import atomic_write_json

LOGDIR = "tensorboard"
STATE_FILE = "tracking.json"
INSTALL_HINT = "pip install 'star-engine-tracking[tensorboard]'"

log = structlog.get_logger("star_tracking")


def writer_class() -> tuple[Any, str]:
    """(tensorboardX.SummaryWriter, "tensorboardX <version>"), or (None, why not)."""
    try:
        import tensorboardX
        from tensorboardX import SummaryWriter
    except ImportError as e:  # the optional extra is not installed (or is broken)
        return None, f"tensorboardX is not importable ({e})"
    return SummaryWriter, f"tensorboardX {tensorboardX.__version__}"


class Tracker:
    def __init__(self, run_dir: Path, writer: Any, state: dict[str, Any]):
        self.run_dir, self.writer, self.state = run_dir, writer, state

    def save(self) -> None:
        atomic_write_json(self.run_dir / STATE_FILE, self.state)

    def scalar(self, tag: str, value: Any, step: int) -> None:
        if value is not None:
            self.writer.add_scalar(tag, float(value), global_step=int(step))

    def curve(self, tag: str, losses: Sequence[float]) -> None:
        for i, loss in enumerate(losses, 1):
            self.scalar(tag, loss, i)

    def iteration(self, n: int, metrics: Sequence[Mapping[str, Any]], losses: Sequence[float]) -> None:
        for row in metrics:
            split, cls = row["split"], row["class"]
            self.scalar(f"accuracy/{split}/{cls}", row.get("accuracy"), n)
            if split == "train":
                # hinted classes ("<c>_r"): rationalized and correct are the same count
                for key in ("kept",) if cls.endswith("_r") else ("kept", "rationalized", "correct"):
                    self.scalar(f"rationales/{key}/{cls}", row.get(key), n)
                if cls == "all":
                    self.scalar("train/coverage", row.get("coverage"), n)
        if metrics:
            first = metrics[0]  # training figures are the same on every row of an iteration
            for key in ("steps", "tokens", "loss"):
                self.scalar(f"train/{key}", first.get(f"train_{key}"), n)
            self.scalar("time/wall_seconds", first.get("wall_seconds"), n)
        self.curve(f"loss/iteration_{n:03d}", losses)
        if n == 0:
            self.curve("loss/base_training", _base_losses(self.run_dir))


def _base_losses(run_dir: Path) -> list[float]:
    """The base model's training curve, when the run trained one (``base/train.json``)."""
    try:
        return [float(x) for x in json.loads((run_dir / "base" / "train.json").read_text())["losses"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


_active: dict[str, Tracker] = {}


def _key(run_dir: Path) -> str:
    return str(Path(run_dir).resolve())


def _read_state(run_dir: Path) -> dict[str, Any]:
    try:
        state = json.loads((run_dir / STATE_FILE).read_text())
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def start(run_dir: Path, config: Mapping[str, Any]) -> None:
    run_dir = Path(run_dir)
    old = _active.pop(_key(run_dir), None)
    if old is not None:  # the same run started again in this process
        old.writer.close()
    previous = _read_state(run_dir)
    logged = previous.get("iterations", [])  # already in the event files
    cls, library = writer_class()
    if cls is None:
        atomic_write_json(run_dir / STATE_FILE, {"tensorboard": False, "reason": library,
                                                 "install": INSTALL_HINT, "iterations": logged})
        log.warning("tracking_disabled", reason=library, install=INSTALL_HINT)
        return
    logdir = run_dir / LOGDIR
    # Event file names hold the time in seconds: a numbered suffix keeps a quick resume
    # from reusing (and truncating) the previous session's file.
    session = len(list(logdir.glob("events.out.tfevents.*"))) if logdir.is_dir() else 0
    writer = cls(logdir=str(logdir), flush_secs=30, filename_suffix=f".s{session:04d}")
    state = {"tensorboard": True, "library": library, "logdir": LOGDIR, "iterations": sorted(set(logged)),
             "finished": False, "summary_step": previous.get("summary_step")}
    tracker = Tracker(run_dir, writer, state)
    if not logged:
        writer.add_text("run/config", "```\n" + json.dumps(config, indent=2, sort_keys=True, default=str)
                        + "\n```", global_step=0)
    tracker.save()
    _active[_key(run_dir)] = tracker
    log.info("tracking_enabled", logdir=str(logdir), library=library)


def iteration_end(run_dir: Path, iteration: int, metrics: Sequence[Mapping[str, Any]],
                  losses: Sequence[float]) -> None:
    tracker = _active.get(_key(run_dir))
    if tracker is None or iteration in tracker.state["iterations"]:
        return  # tracking is off, or this iteration was logged before the run was resumed
    tracker.iteration(iteration, metrics, losses)
    tracker.writer.flush()
    tracker.state["iterations"] = sorted([*tracker.state["iterations"], iteration])
    tracker.save()


def finish(run_dir: Path, metrics: Sequence[Mapping[str, Any]]) -> None:
    tracker = _active.pop(_key(run_dir), None)
    if tracker is None:
        return
    best: dict[str, float] = {}
    for row in metrics:
        if row["class"] == "all" and row["split"] != "train" and row.get("accuracy") is not None:
            best[row["split"]] = max(best.get(row["split"], 0.0), float(row["accuracy"]))
    last = max((r["iteration"] for r in metrics), default=0)
    if tracker.state["summary_step"] != last:  # not when a finished run is merely rerun
        for split, acc in sorted(best.items()):
            tracker.scalar(f"best_accuracy/{split}", acc, last)
        tracker.state["summary_step"] = last
    tracker.writer.close()
    tracker.state["finished"] = True
    tracker.save()
