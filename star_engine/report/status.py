"""``star-engine status RUN_DIR``: whether a run is finished, running (who holds its lock) or
stopped, and where: the stage of the iteration it is at, the time it has spent and, where it
can be estimated, the time it has left. Reads only, never locks (``runlock.holder`` asks).

Where it is (``position``): the first stage of the iteration after the last one recorded
(``iterations/NNN/metrics.parquet``) whose file the manifest does not record yet, in the order of
``loop.run_star``. The time spent: the sum, over the starts in ``events.jsonl`` (``start``,
``resume``), of the time from each start to its last event (to now for a running one). The time
left: the mean wall time of the iterations done (``metrics.parquet`` ``wall_seconds``, iteration 0
left out) times the iterations still to run, less what the current one has run so far; the
iterations to run assume that the run goes to ``experiment.iterations`` (an early stop ends it
sooner), and an iteration resumed after a stop counts from its resumption (so the mean errs
short)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from ..errors import UserError
from ..rundir.layout import CONFIG_MAX, killed_at_start
from ..rundir.runlock import holder
from ..rundir.store import read_json_file, read_manifest

EVENTS = "events.jsonl"
_METRICS = re.compile(r"^iterations/(\d{3,})/metrics\.parquet$")
_ITERATION = re.compile(r"^iterations/(\d{3,})/")


@dataclass(frozen=True)
class Run:
    """A run directory as it is on disk: ``config.json`` and the manifest's artifacts."""

    root: Path
    config: dict[str, Any]
    manifest: dict[str, Any]

    @property
    def artifacts(self) -> Mapping[str, Any]:
        return self.manifest.get("artifacts", {})

    @property
    def iterations(self) -> int:
        """``experiment.iterations`` as the run was started (or last resumed) with."""
        return int(self.config.get("experiment", {}).get("iterations", 0))

    @property
    def finished(self) -> bool:
        return self.manifest.get("finished") is True


def not_a_run(root: Path) -> UserError:
    return UserError(f"{root}: not a star-engine run directory (no config.json); give an experiment's "
                     f"output_dir, e.g. runs/addition")


def open_run(root: Path) -> Run:
    """The run directory ``root`` (reads only); a ``UserError`` naming it when it is not one."""
    if not root.is_dir():
        raise UserError(f"{root}: not a star-engine run directory (not a folder)" if root.exists()
                        else f"{root}: no such run directory")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise not_a_run(root)
    config = read_json_file(cfg_file, CONFIG_MAX, "config.json")
    if not isinstance(config, dict):
        raise UserError(f"{cfg_file}: unreadable config.json (not a JSON object)")
    return Run(root, config, read_manifest(root) or {"artifacts": {}, "checkpoints": {}})


def _it_dir(n: int) -> str:
    return f"iterations/{n:03d}"


def iterations_done(artifacts: Mapping[str, Any]) -> list[int]:
    """The iterations whose rows are recorded (their ``metrics.parquet``), in order."""
    return sorted(int(m.group(1)) for rel in artifacts if (m := _METRICS.match(rel)))


def iterations_present(artifacts: Mapping[str, Any]) -> list[int]:
    """The iterations with any recorded file, in order."""
    return sorted({int(m.group(1)) for rel in artifacts if (m := _ITERATION.match(rel))})


def stages_of(cfg: Mapping[str, Any], n: int) -> list[tuple[str, list[str]]]:
    """Iteration ``n``'s stages, in the order ``loop.run_star`` runs them, each with the files
    that say it is done."""
    d, N = _it_dir(n), int(cfg["experiment"]["iterations"])
    ev, gen, ver = cfg.get("evaluation", {}), cfg.get("generation", {}), cfg.get("verifier", {})
    evaluating = n == 0 or n % max(int(ev.get("every", 1) or 1), 1) == 0 or n == N
    verifier = n > 0 and bool(ver.get("enabled")) and (n == N if ver.get("schedule", "final") == "final"
                                                       else evaluating)
    out: list[tuple[str, list[str]]] = []
    if n > 0:
        if cfg.get("training", {}).get("source") == "gold":
            out.append(("gold", [f"{d}/rationales.parquet"]))
        else:
            if gen.get("tuner"):
                out.append(("tune", [f"{d}/tuning.parquet"]))
            out.append(("generate", [f"{d}/generated.parquet"]))
            if cfg.get("rationalization", {}).get("enabled"):
                out.append(("rationalize", [f"{d}/rationalized.parquet"]))
            out.append(("select", [f"{d}/rationales.parquet"]))
        out.append(("train", [f"{d}/train.json"]))
        if verifier:
            out.append(("verifier", [f"{d}/verifier/train.json"]))
    if evaluating:
        splits = list(ev.get("splits", []))
        sampled = int(ev.get("samples_per_question", 1) or 1) > 1 or verifier
        out.append(("evaluate", [f"{d}/eval_{s}.parquet" for s in splits]
                    + [f"{d}/eval_{s}_samples.parquet" for s in splits if sampled]))
    out.append(("record", [f"{d}/metrics.parquet"]))
    return out


def position(run: Run) -> tuple[int | None, str]:
    """(iteration, stage) the run is at or stopped at: the iteration after the last one recorded
    and its first stage not done. (None, "base training") before the first iteration;
    (N, "finish") when every iteration is recorded but the run has not finished (its report)."""
    cfg, arts = run.config, run.artifacts
    done = iterations_done(arts)
    base_steps = cfg.get("base_training", {}).get("steps", 0)
    if not iterations_present(arts) and base_steps and "base/train.json" not in arts:
        return None, "base training"
    n = done[-1] + 1 if done else (0 if cfg.get("evaluation", {}).get("at_start", True) else 1)
    if n > run.iterations:
        return run.iterations, "finish"
    for stage, rels in stages_of(cfg, n):
        if any(rel not in arts for rel in rels):
            return n, stage
    return n, "record"


def read_events(root: Path) -> list[dict[str, Any]]:
    """``events.jsonl``'s events, in order (a line that is no JSON object, as a torn last line, is
    left out); none when there is no such file."""
    path = root / EVENTS
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and isinstance(ev.get("event"), str):
                out.append(ev)
    return out


def _stamp(ev: Mapping[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(ev["timestamp"])).timestamp()
    except (KeyError, ValueError):
        return None


def sessions(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, list[Mapping[str, Any]]]]:
    """Each start of the run (``start`` or ``resume``): (its time, the time of its last event, its
    events)."""
    out: list[tuple[float, float, list[Mapping[str, Any]]]] = []
    for ev in events:
        t = _stamp(ev)
        if t is None:
            continue
        if ev["event"] in ("start", "resume") or not out:
            out.append((t, t, [ev]))
        else:
            begin, _, evs = out[-1]
            out[-1] = (begin, max(t, out[-1][1]), [*evs, ev])
    return out


def iteration_seconds(root: Path) -> dict[int, float]:
    """Each recorded iteration's wall time (``metrics.parquet``'s ``wall_seconds``)."""
    import pyarrow.parquet as pq

    from ..errors import IntegrityError

    path = root / "metrics.parquet"
    if not path.is_file():
        return {}
    try:
        rows = pq.read_table(path, columns=["iteration", "wall_seconds"]).to_pylist()
    except Exception as e:  # noqa: BLE001 -- an unreadable file is named, whatever pyarrow raised
        raise IntegrityError(f"{path}: unreadable metrics file ({e})") from None
    out: dict[int, float] = {}
    for r in rows:
        if r["wall_seconds"] is not None:
            out[r["iteration"]] = max(out.get(r["iteration"], 0.0), float(r["wall_seconds"]))
    return out


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass(frozen=True)
class Status:
    root: Path
    state: str  # "finished", "running", "stopped"
    holder: str | None  # the lock's note while running
    iterations: int  # experiment.iterations
    done: int | None  # the last iteration recorded (None: none yet)
    at: tuple[int | None, str] | None  # (iteration, stage) running or stopped at; None when finished
    spent: float  # seconds, events.jsonl
    starts: int  # starts and resumptions
    left: float | None  # seconds (None: not estimated)
    left_how: str  # how `left` was estimated, or why not
    why: str | None  # how it ended: an error's message, an early stop


def _why(events: Sequence[Mapping[str, Any]]) -> str | None:
    """What ended the last session: its error (``fatal``) or an early stop."""
    for ev in reversed(events):
        if ev["event"] == "fatal":
            return str(ev.get("message") or ev.get("kind") or "an error")
        if ev["event"] == "early_stop":
            return f"early stop after iteration {ev.get('iteration')} (experiment.early_stop_patience)"
        if ev["event"] == "collapse_stop":
            return f"collapse guard after iteration {ev.get('iteration')} (experiment.collapse_patience)"
    return None


def status(root: Path, now: float | None = None) -> Status:
    """The state of run ``root`` (``UserError`` when it is no run directory)."""
    now = time.time() if now is None else now
    who = holder(root) if root.is_dir() else None
    run = open_run(root)
    events = read_events(root)
    runs = sessions(events)
    spent = sum(end - begin for begin, end, _ in runs[:-1])
    if runs:
        begin, end, last = runs[-1]
        spent += (now if who else end) - begin
    state = "running" if who else "finished" if run.finished else "stopped"
    done = iterations_done(run.artifacts)
    at = None if state == "finished" else position(run)
    left, how = None, ""
    if state != "finished":
        left, how = _left(run, done, runs if who else [], now)
    return Status(root, state, who, run.iterations, done[-1] if done else None, at, max(spent, 0.0), len(runs),
                  left, how, _why(runs[-1][2]) if runs else None)


def _left(run: Run, done: list[int], running: list, now: float) -> tuple[float | None, str]:
    seconds = iteration_seconds(run.root)
    times = [seconds[n] for n in done if n > 0 and n in seconds]
    if not times:
        return None, "no iteration is done yet to measure one by"
    mean = sum(times) / len(times)
    to_go = run.iterations - (done[-1] if done else 0)
    if to_go <= 0:
        return 0.0, "every iteration is done"
    done_n = "the 1 iteration done" if len(times) == 1 else f"the {len(times)} iterations done"
    left, how = mean * to_go, f"{clock(mean)} per iteration, the mean of {done_n} (metrics.parquet " \
                              f"wall_seconds), x {to_go} to go"
    if running:  # less what the current iteration has run: since its start, or the last iteration's end
        events = running[-1][2]
        marks = [t for ev in events if ev["event"] in ("start", "resume", "iteration_done")
                 and (t := _stamp(ev)) is not None]
        if marks:
            elapsed = max(now - max(marks), 0.0)
            left, how = max(left - elapsed, 0.0), how + f", less the {clock(elapsed)} the current one has run"
    return left, how + ", if it runs every iteration"


def lines(st: Status) -> list[str]:
    """What ``star-engine status`` prints."""
    of = f"of {st.iterations}"
    if st.state == "finished":
        done = st.done if st.done is not None else 0
        head = (f"{st.root}: finished (iteration {done} {of})" if done >= st.iterations
                else f"{st.root}: finished early (iteration {done} {of}: {st.why or 'stopped early'})")
    else:
        assert st.at is not None
        n, stage = st.at
        where = (f"stage {stage}, before iteration 1" if n is None
                 else f"writing the report, after iteration {n} {of}" if stage == "finish"
                 else f"stage {stage} of iteration {n} {of}")
        if st.state == "running":
            head = f"{st.root}: running ({st.holder}): {where}"
        else:
            head = f"{st.root}: stopped at {where}" + (f" ({st.why})" if st.why else "") + "; run again to resume"
    starts = "1 start" if st.starts == 1 else f"{st.starts} starts"
    to = "the current one to now" if st.state == "running" else "each to its last event"
    out = [head, f"time spent: {clock(st.spent)} ({EVENTS}: {starts}, {to})"]
    if st.state != "finished":
        left = "unknown" if st.left is None else f"about {clock(st.left)}"
        out.append(f"time left: {left} ({st.left_how})")
    return out


def rerun_note(root: Path, iterations: int) -> str:
    """What running an experiment of ``iterations`` iterations again does in its run directory
    ``root``, which holds a run of its configuration (``star-engine validate``)."""
    who = holder(root)
    if who:
        return f"in use by a run ({who}): run is refused until it ends"
    run = open_run(root)
    done = iterations_done(run.artifacts)
    last = done[-1] if done else 0
    if run.finished:
        where = (f"finished (iteration {last} of {run.iterations})" if last >= run.iterations
                 else f"finished early (after iteration {last} of {run.iterations})")
        if iterations > run.iterations:
            return f"{where}; experiment.iterations is now {iterations}: run continues it"
        return f"{where}; run again does nothing"
    n, stage = position(run)
    where = (f"stage {stage}, before iteration 1" if n is None else f"the report, after iteration {n}"
             if stage == "finish" else f"stage {stage} of iteration {n}")
    return f"stopped at {where} of {iterations}: run resumes it there" if n is not None and stage != "finish" \
        else f"stopped at {where}: run resumes it there"


def command(root: Path) -> int:
    """``star-engine status RUN_DIR``."""
    if root.is_dir() and not (root / "config.json").is_file():
        who = holder(root)
        if who:
            print(f"{root}: starting ({who}): the run has not written its configuration yet")
            return 0
        if killed_at_start(root):
            print(f"{root}: stopped at its start (before it wrote config.json); run again to start it")
            return 0
    for line in lines(status(root)):
        print(line)
    return 0
