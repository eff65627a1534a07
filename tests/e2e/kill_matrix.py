#!/usr/bin/env python3
"""Kill matrix: SIGKILL a real run at many moments, resume it, and prove nothing was lost.

The embedded-default experiment (``experiments/addition.toml``, snapshotted when the
matrix starts) is run shortened — ``--limit 12``, 2 iterations, a 2 x 64 byte-level
GPT-J, 200 base-training steps — with the real ``haiku_xmap`` backend:

1. a **boundary chain**: a fresh run directory where the command is started, SIGKILLed
   as soon as a stage's file appears, started again (it resumes), killed at the next
   boundary, ... and finally left to finish. The boundaries: the run directory's
   creation (``events.jsonl``), the base model (``base/train.json``), ``generated``,
   ``rationalized``, ``rationales.parquet``, the fine-tuned checkpoint, ``train.json``,
   ``eval_dev.parquet`` and ``metrics.parquet`` of iteration 1, and the report;
2. an uninterrupted **reference** run, polled every few milliseconds to record when
   each file of the run directory first appears (the run's timeline); it runs after
   the boundary chain, which has filled the compilation cache, so that its timeline
   has the speed of a resumed attempt;
3. **random chains**: N kills at moments ``m`` drawn with a fixed seed over the
   reference's duration (up to its last file), in order, on a fresh run directory
   (another one when the run finished before the next moment). ``m`` lies between two
   files of the timeline, ``a`` (at ``t_a``) and ``b``: the attempt is killed
   ``m - t_a`` seconds after it reaches ``a`` (when ``a`` appears, or, if ``a`` was
   already there, when the resumed process has re-opened the run directory), or as
   soon as ``b`` (or the first later file it does not have yet) appears;
4. a **periodic chain** (``--periodic``): a fresh run directory killed every F x the
   reference's base-training time (F = 0.5: more often than that stage lasts) after
   each attempt re-opened the run directory, until an attempt finishes by itself;
   fine-tuning snapshots its state every 10 steps (``model.train_checkpoint_steps``),
   so the stage resumes mid-way instead of starting over and the run does finish;
5. after each kill, the temporaries the killed process left (``.tmp-*``, and the
   backend's ``.<name>.tmp-*`` folders) must be gone once the next attempt has
   re-opened the run directory, and a finished run has none;
6. when a chain's run has finished, its Parquet rows (``wall_seconds`` aside), its
   ``train.json`` files (``seconds`` aside) and the parameters of every checkpoint
   (loaded with ``star_haiku_xmap.checkpoint.format.load_checkpoint``, compared bit for
   bit) must equal the reference's: 0 rows lost, 0 duplicated, 0 changed; and the
   source files must not have changed since the reference ran.

Usage::

    python tests/e2e/kill_matrix.py                 # 20 random kills + every boundary
    python tests/e2e/kill_matrix.py --random 5 --boundaries start,checkpoint --seed 3

It prints every kill, then the totals (kills, resumes, rows compared, differences)
and exits 1 when differences > 0 or fewer kills landed than asked for.

A JAX persistent compilation cache private to the matrix's work folder is used by
every process (``--no-jax-cache`` turns it off): it only saves compile time, the
computations are the same.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

from star_engine.rundir.fsio import is_temporary  # the one rule the store cleans by

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "addition.toml"
LIMIT = 12
ITERATIONS = 2
# Whole tables are replaced, so that tuning experiments/addition.toml does not change
# what the matrix runs (it needs a base model good enough that iterations fine-tune).
OVERRIDES = [
    f"experiment.iterations={ITERATIONS}",
    "task.options={ seed = 0, n_train = 60, n_dev = 16, min_digits = 1, max_digits = 1, n_seed = 60, "
    "seed_max_digits = 1, seed_hint_fraction = 1.0, n_shots = 0 }",
    "generation.max_new_tokens=48",
    "generation.batch_size=8",
    "generation.chunk_size=4",  # several stored chunks per generation stage
    "generation.samples_per_question=1",
    "generation.n_train_samples=0",
    "base_training={ steps = 200, batch_size = 8, grad_accum = 1, optimizer = { lr = 3e-3, warmup_steps = 20, "
    "schedule = \"cosine\", end_lr = 1e-4 } }",
    "training.schedule={ name = \"exponential_grow\", start_steps = 6, grow = 1.2 }",
    "training.optimizer={ lr = 5e-4, warmup_steps = 10, schedule = \"cosine\", end_lr = 5e-5, weight_decay = 0.0, "
    "clip_norm = 1.0 }",
    "rationalization={ enabled = true, p_rationalization = 1.0, p_show_hint_save = 0.0 }",
    "training.batch_size=4",
    "training.restart_from_base=true",
    "model={ backend = \"haiku_xmap\", preset = \"tiny\", tokenizer = \"byte\", dtype = \"float32\", n_layer = 2, "
    "d_model = 64, n_head = 2, d_head = 32, d_ff = 256, n_ctx = 128, mesh = { dp = 1, mp = 1 } }",
]
# The periodic chain (``Matrix.periodic_chain``) snapshots fine-tuning every few steps, so
# that a stage killed before it ends resumes where it was (star_haiku_xmap/resume.py).
SNAPSHOT_STEPS = 10
PERIODIC_OVERRIDES = OVERRIDES[:-1] + [OVERRIDES[-1][:-2] + f", train_checkpoint_steps = {SNAPSHOT_STEPS} }}"]

START = "events.jsonl"  # the first file of a fresh run directory
BOUNDARIES = {  # name -> the file whose appearance ends the stage
    "start": START,
    "base": "base/train.json",
    "generated": "iterations/001/generated.parquet",
    "rationalized": "iterations/001/rationalized.parquet",
    "rationales": "iterations/001/rationales.parquet",
    "checkpoint": "iterations/001/model/manifest.msgpack",
    "train": "iterations/001/train.json",
    "eval": "iterations/001/eval_dev.parquet",
    "metrics": "iterations/001/metrics.parquet",
    "report": "report.md",
}
POLL = 0.002
ATTEMPT_TIMEOUT = 900.0


PACKAGES = ("star_engine", "star_haiku_xmap", "star_arithmetic", "star_filters", "star_schedules", "star_tracking")


def sources() -> dict[str, str]:
    """sha256 of every source file of the packages the run imports (as they would be imported):
    a reference is only comparable with runs of the same code."""
    out = {}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for p in sorted(Path(folder).rglob("*.py")):
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def temporaries(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if is_temporary(name):
                out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def _opened(events: bytes) -> bool:
    """Whether these new lines of events.jsonl show a process that (re-)opened the run directory."""
    return b'"event": "resume"' in events or b'"event": "start"' in events


def listing(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):  # noqa: B007
        for name in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def saved(root: Path) -> dict[str, tuple[int, int, int]]:
    """file -> (inode, mtime, size) of every finished file of the run, training snapshots
    included (a new snapshot is a new folder); an inode alone can be reused by the next file."""
    if not root.exists():
        return {}
    out = {}
    for rel in listing(root):
        if not any(is_temporary(part) for part in Path(rel).parts):
            try:
                st = (root / rel).stat()
                out[rel] = (st.st_ino, st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                pass
    return out


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


# Rewritten (or, tensorboard/, written anew) by every start or every iteration whatever was
# done before: not stage outputs, and no sign that an attempt got anywhere.
BOOKKEEPING = {"config.json", "manifest.json", "requirements.txt", "events.jsonl", "metrics.parquet", "report.png",
               "report.md", "tracking.json", ".lock", "experiment.toml"}


def is_bookkeeping(rel: str) -> bool:
    return rel in BOOKKEEPING or rel.startswith("tensorboard/")


class Progress:
    """What an attempt has saved since it started: a stage output (a training snapshot
    included) that was not there, or one replaced by different bytes. Neither the files every
    start writes (``BOOKKEEPING``: the manifest, the event log, a new tensorboard file, ...) nor
    a finished file rewritten with the same bytes count: counting them let a chain kill every
    attempt right after start-up (or, at the end, right after the report's re-render), for
    ever, whenever the kill interval was shorter than an attempt needs to reach its next
    stage output or snapshot (a loaded machine)."""

    def __init__(self, root: Path):
        self.root = root
        self.before = saved(root)
        self.digests = {rel: _digest(root / rel) for rel in self.before if not is_bookkeeping(rel)}

    def made(self) -> bool:
        for rel, sig in saved(self.root).items():
            if is_bookkeeping(rel):
                continue
            if rel not in self.before:
                return True
            if sig != self.before[rel]:
                digest = _digest(self.root / rel)
                if digest is not None and digest != self.digests[rel]:
                    return True
        return False


# ---------------------------------------------------------------------------- snapshots


@dataclasses.dataclass
class Snapshot:
    """What a run produced that must not depend on interruptions."""

    parquet: dict[str, list[dict]]
    train: dict[str, dict]
    checkpoints: dict[str, dict[str, Any]]  # folder -> {"arrays": {name: ndarray}, "extra": ..., ...}


def snapshot(run_dir: Path) -> Snapshot:
    import numpy as np
    import pyarrow.parquet as pq

    from star_haiku_xmap.checkpoint.format import load_checkpoint

    parquet, train, checkpoints = {}, {}, {}
    for p in sorted(run_dir.rglob("*.parquet")):
        rel = p.relative_to(run_dir).as_posix()
        if any(is_temporary(part) for part in p.relative_to(run_dir).parts):
            continue
        rows = pq.read_table(p).to_pylist()
        for r in rows:
            r.pop("wall_seconds", None)
        parquet[rel] = rows
    for p in sorted(run_dir.rglob("train.json")):
        info = json.loads(p.read_text())
        info.pop("seconds", None)
        train[p.relative_to(run_dir).as_posix()] = info
    for m in sorted(run_dir.rglob("manifest.msgpack")):
        if any(is_temporary(part) for part in m.relative_to(run_dir).parts):
            continue
        params, manifest = load_checkpoint(m.parent)
        arrays = {}
        stack = [((), params)]
        while stack:
            prefix, node = stack.pop()
            for k, v in node.items():
                if isinstance(v, dict):
                    stack.append((prefix + (k,), v))
                else:
                    arrays["/".join(prefix + (k,))] = np.asarray(v)
        checkpoints[m.parent.relative_to(run_dir).as_posix()] = {
            "arrays": arrays, "extra": manifest["extra"], "model_config": manifest["model_config"],
            "tokenizer": manifest["tokenizer"]}
    return Snapshot(parquet, train, checkpoints)


@dataclasses.dataclass
class Comparison:
    rows: int = 0  # reference rows compared
    lost: int = 0
    duplicated: int = 0
    changed: int = 0
    arrays: int = 0
    checkpoints: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def differences(self) -> int:
        return len(self.problems)

    def add(self, other: Comparison) -> None:
        for f in ("rows", "lost", "duplicated", "changed", "arrays", "checkpoints"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.problems += other.problems


_KEY_COLUMNS = ("question_id", "iteration", "sample", "was_hinted", "split", "class", "index")


def _row_key(row: dict) -> tuple:
    return tuple((c, row[c]) for c in _KEY_COLUMNS if c in row)


def _frozen(row: dict) -> str:
    return json.dumps(row, sort_keys=True, default=repr)


def compare(ref: Snapshot, got: Snapshot) -> Comparison:
    """Every difference between two snapshots, one line each (empty when equal)."""
    import numpy as np

    c = Comparison()
    for rel in sorted(set(ref.parquet) | set(got.parquet)):
        a, b = ref.parquet.get(rel), got.parquet.get(rel)
        if b is None:
            c.rows += len(a)
            c.lost += len(a)
            c.problems.append(f"{rel}: missing ({len(a)} rows lost)")
            continue
        if a is None:
            c.duplicated += len(b)
            c.problems.append(f"{rel}: not in the reference ({len(b)} extra rows)")
            continue
        c.rows += len(a)
        ka = collections.Counter(map(_row_key, a))
        kb = collections.Counter(map(_row_key, b))
        lost = sum((ka - kb).values())
        dup = sum((kb - ka).values())
        fa, fb = collections.Counter(map(_frozen, a)), collections.Counter(map(_frozen, b))
        changed = max(sum((fa - fb).values()) - lost, 0)
        c.lost += lost
        c.duplicated += dup
        c.changed += changed
        if lost or dup or changed:
            c.problems.append(f"{rel}: {lost} rows lost, {dup} duplicated or extra, {changed} changed")
        elif a != b:
            c.problems.append(f"{rel}: same rows in a different order")
    for rel in sorted(set(ref.train) | set(got.train)):
        if ref.train.get(rel) != got.train.get(rel):
            c.problems.append(f"{rel}: differs from the reference")
    for rel in sorted(set(ref.checkpoints) | set(got.checkpoints)):
        a, b = ref.checkpoints.get(rel), got.checkpoints.get(rel)
        if a is None or b is None:
            c.problems.append(f"{rel}: checkpoint only in the {'resumed run' if a is None else 'reference'}")
            continue
        c.checkpoints += 1
        for key in ("extra", "model_config", "tokenizer"):
            if a[key] != b[key]:
                c.problems.append(f"{rel}: manifest field {key!r} differs")
        for name in sorted(set(a["arrays"]) | set(b["arrays"])):
            x, y = a["arrays"].get(name), b["arrays"].get(name)
            c.arrays += 1
            if x is None or y is None:
                c.problems.append(f"{rel}: parameter {name} only in one of the runs")
            elif x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                n = int(np.sum(x != y)) if x.shape == y.shape else -1
                c.problems.append(f"{rel}: parameter {name} is not bit-identical ({n} elements differ)")
    return c


# ---------------------------------------------------------------------------- processes


def jax_cache_env(cache_dir: Path | None) -> dict[str, str]:
    if cache_dir is None:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(cache_dir), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def run_env(cache_dir: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    env.update({"JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"})
    env.update(jax_cache_env(cache_dir))
    return env


@dataclasses.dataclass
class Reference:
    run_dir: Path
    seconds: float
    timeline: list[tuple[float, str]]  # (seconds after start, file) of files that stay
    snap: Snapshot
    sources: dict[str, str] = dataclasses.field(default_factory=dict)

    def code_changes(self) -> list[str]:
        """Source files edited since the reference ran (its results then say nothing)."""
        now = sources()
        return sorted(p for p in set(now) | set(self.sources) if now.get(p) != self.sources.get(p))


@dataclasses.dataclass
class Kill:
    kind: str  # "boundary" | "random"
    name: str  # boundary name, or "m=12.34s"
    at: float  # position in the reference timeline
    anchor: str | None  # file reached before the kill (None: process start)
    delay: float  # seconds after the anchor
    later: list[str]  # files after the moment, in timeline order: kill at the latest when the
    # first of them that the attempt did not start with appears
    # filled in when it ran:
    landed: bool = False
    seconds: float = 0.0  # after the attempt started
    state: str = ""  # last timeline file present at the kill
    left: list[str] = dataclasses.field(default_factory=list)  # temporaries left by the killed process
    snapshots: list[str] = dataclasses.field(default_factory=list)  # training snapshots present at the kill


class Matrix:
    def __init__(self, workdir: Path, *, seed: int = 20240607, jax_cache: bool = True,
                 out: Callable[[str], None] = print, experiment: Path = EXPERIMENT):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.toml = workdir / "addition.toml"
        if not self.toml.exists():  # a snapshot: the experiment file may be edited meanwhile
            shutil.copyfile(experiment, self.toml)
        self.seed = seed
        self.cache = workdir / "jax-cache" if jax_cache else None
        self.env = run_env(self.cache)
        self.out = out
        self.logs = workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self._n = 0
        self.timeline: list[tuple[float, str]] = []  # the reference's, once it ran

    def command(self, run_dir: Path) -> list[str]:
        cmd = [sys.executable, "-m", "star_engine", "run", str(self.toml), "--quiet", "--limit", str(LIMIT)]
        overrides = PERIODIC_OVERRIDES if run_dir.name.startswith("periodic") else OVERRIDES
        for item in overrides + [f'experiment.output_dir="{run_dir.as_posix()}"']:
            cmd += ["--set", item]
        return cmd

    def _start(self, run_dir: Path) -> tuple[subprocess.Popen, Path]:
        self._n += 1
        log = self.logs / f"{self._n:03d}-{run_dir.name}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(self.command(run_dir), stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=self.workdir)
        return proc, log

    @staticmethod
    def _tail(log: Path, n: int = 1500) -> str:
        return log.read_text(errors="replace")[-n:]

    def run_to_end(self, run_dir: Path) -> tuple[int, float, Path]:
        t = time.monotonic()
        proc, log = self._start(run_dir)
        rc = proc.wait(timeout=ATTEMPT_TIMEOUT)
        return rc, time.monotonic() - t, log

    # -- the reference ----------------------------------------------------------------
    def reference(self, name: str = "reference") -> Reference:
        run_dir = self.workdir / name
        shutil.rmtree(run_dir, ignore_errors=True)
        code = sources()
        seen: dict[str, float] = {}
        t0 = time.monotonic()
        proc, log = self._start(run_dir)
        while True:
            rc = proc.poll()
            now = time.monotonic() - t0
            if run_dir.exists():
                for rel in listing(run_dir):
                    seen.setdefault(rel, now)
            if rc is not None:
                break
            time.sleep(0.005)
        seconds = time.monotonic() - t0
        if rc != 0:
            raise RuntimeError(f"the reference run failed (exit {rc}):\n{self._tail(log)}")
        final = set(listing(run_dir))
        self.timeline = sorted((t, rel) for rel, t in seen.items()
                               if rel in final and not rel.endswith(".zst") and not rel.startswith("tensorboard/"))
        ref = Reference(run_dir, seconds, self.timeline, snapshot(run_dir), code)
        if ref.code_changes():
            raise RuntimeError(f"source files changed while the reference ran: {ref.code_changes()}")
        return ref

    # -- kills ----------------------------------------------------------------------------
    @staticmethod
    def boundary_kills(names: Iterable[str], ref: Reference | None = None) -> list[Kill]:
        """One kill per boundary; ``at`` is the file's time in the reference when there is one,
        else its position in BOUNDARIES (which is in the order of the run)."""
        if ref is not None:
            when = {rel: t for t, rel in ref.timeline}
        else:
            when = {rel: float(i) for i, rel in enumerate(BOUNDARIES.values())}
        return [Kill("boundary", name, when[BOUNDARIES[name]], BOUNDARIES[name], 0.0, []) for name in names]

    def random_kills(self, ref: Reference, n: int, rng: random.Random, lo: float = 0.0) -> list[Kill]:
        """``n`` moments drawn uniformly from [lo, the reference's last file] (after it, the
        process only exits)."""
        hi = ref.timeline[-1][0]
        kills = []
        for _ in range(n):
            m = rng.uniform(lo, hi)
            before = [(t, rel) for t, rel in ref.timeline if t <= m]
            after = [(t, rel) for t, rel in ref.timeline if t > m]
            t_a, anchor = before[-1] if before else (0.0, None)
            kills.append(Kill("random", f"m={m:.2f}s", m, anchor, m - t_a, [rel for _, rel in after]))
        return kills

    def _attempt(self, run_dir: Path, kill: Kill) -> tuple[int | None, Path]:
        """Start the command and kill it as ``kill`` says; returns (exit code or None if killed, log)."""
        anchor_existed = kill.anchor is not None and (run_dir / kill.anchor).exists()
        if kill.kind == "boundary" and anchor_existed:
            raise RuntimeError(f"boundary {kill.name}: {kill.anchor} exists before the attempt")
        until = next((rel for rel in kill.later if not (run_dir / rel).exists()), None)
        events = run_dir / "events.jsonl"
        offset = events.stat().st_size if events.exists() else 0
        t_start = time.monotonic()
        proc, log = self._start(run_dir)
        t0 = t_start if kill.anchor is None else None
        opened = False
        while True:
            rc = proc.poll()
            if rc is not None:
                return rc, log
            now = time.monotonic()
            if now - t_start > ATTEMPT_TIMEOUT:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"attempt timed out: {log}")
            if t0 is None:
                if not anchor_existed:
                    if (run_dir / kill.anchor).exists():
                        t0 = now
                else:  # the anchor is from an earlier attempt: count from when this one re-opened the run
                    if not opened and events.exists():
                        with open(events, "rb") as f:
                            f.seek(offset)
                            opened = _opened(f.read())
                    if opened:
                        t0 = now
            due = t0 is not None and now - t0 >= kill.delay
            clamp = until is not None and (run_dir / until).exists()
            if due or clamp:
                self._kill(proc, run_dir, kill, t_start)
                return None, log
            time.sleep(POLL)

    def _kill(self, proc: subprocess.Popen, run_dir: Path, kill: Kill, t_start: float) -> None:
        """SIGKILL the attempt and note where it was: the last file, the temporaries it
        left and the training snapshots (stages killed mid-training) present."""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kill.landed = True
        kill.seconds = time.monotonic() - t_start
        kill.state = self._state(run_dir, kill)
        kill.left = temporaries(run_dir) if run_dir.exists() else []
        kill.snapshots = sorted(p.parent.relative_to(run_dir).as_posix()
                                for p in run_dir.rglob("*.partial/manifest.msgpack"))

    def _booked(self, res: ChainResult, kill: Kill, rc: int | None, run_dir: Path, pending: list[str],
                events: Path, offset: int) -> list[str]:
        """Count an attempt, check the previous kill's temporaries are gone, and record
        ``kill`` when it landed (``rc`` None). Returns the temporaries to check next."""
        res.attempts += 1
        self._check_orphans(run_dir, pending, events, offset, res)
        if rc is not None:
            return pending
        res.kills.append(kill)
        snaps = f"  snapshots: {', '.join(kill.snapshots)}" if kill.snapshots else ""
        self.out(f"  kill {len(res.kills):2d}  {kill.kind:8s} {kill.name:13s} at {kill.seconds:6.2f} s  "
                 f"{kill.state:44s} temporaries left: {len(kill.left)}{snaps}")
        return kill.left

    def _state(self, run_dir: Path, kill: Kill) -> str:
        order = self.timeline or [(0.0, rel) for rel in BOUNDARIES.values()]
        have = [rel for _, rel in order if (run_dir / rel).exists()]
        return f"after {have[-1]}" if have else "before the run directory"

    def chain(self, name: str, kills: list[Kill]) -> tuple[ChainResult, list[Kill]]:
        """Run ``kills`` (in order) on a fresh run directory, then let it finish (``compare``
        checks the result). Returns the result and the kills that could not be placed
        (the run finished before them)."""
        run_dir = self.workdir / name
        shutil.rmtree(run_dir, ignore_errors=True)
        res = ChainResult(name, run_dir)
        pending: list[str] = []  # temporaries left by the last kill, to be gone after the next start
        events = run_dir / "events.jsonl"
        for i, kill in enumerate(kills):
            offset = events.stat().st_size if events.exists() else 0
            rc, log = self._attempt(run_dir, kill)
            pending = self._booked(res, kill, rc, run_dir, pending, events, offset)
            if rc is None:
                continue
            if rc == 0:  # the run finished before this kill: place the rest in another chain
                self.out(f"  ({kill.kind} {kill.name}: the run finished first; moved to the next chain)")
                res.finished = True
                return res, kills[i:]
            res.problems.append(f"{name}: attempt {res.attempts} exited {rc}: {self._tail(log, 600)!r}")
            self.out(f"  attempt {res.attempts} FAILED with exit {rc}; log {log}")
            return res, []
        offset = events.stat().st_size if events.exists() else 0
        rc, seconds, log = self.run_to_end(run_dir)
        res.attempts += 1
        self._check_orphans(run_dir, pending, events, offset, res)
        if rc != 0:
            res.problems.append(f"{name}: the final resume exited {rc}: {self._tail(log, 600)!r}")
            self.out(f"  final resume FAILED with exit {rc}; log {log}")
            return res, []
        self.out(f"  final resume: exit 0 in {seconds:.1f} s")
        res.finished = True
        return res, []

    def periodic_chain(self, every: float, name: str = "periodic", max_attempts: int = 200) -> ChainResult:
        """Kill the run ``every`` seconds after each attempt re-opened the run directory,
        again and again, until an attempt finishes by itself; ``every`` is shorter than the
        longest stage (base training), which only ends because fine-tuning snapshots every
        ``SNAPSHOT_STEPS`` steps (``PERIODIC_OVERRIDES``). An attempt that has saved nothing
        new yet (no new file, no new snapshot) by then is killed as soon as it has, so that
        the chain ends. ``compare`` checks the result against the reference."""
        run_dir = self.workdir / name
        shutil.rmtree(run_dir, ignore_errors=True)
        res = ChainResult(name, run_dir)
        events, pending = run_dir / "events.jsonl", []
        while res.attempts < max_attempts:
            offset = events.stat().st_size if events.exists() else 0
            progress = Progress(run_dir)
            kill = Kill("periodic", f"every {every:.1f} s", 0.0, None, every, [])
            t_start = time.monotonic()
            proc, log = self._start(run_dir)
            t0, rc = None, None
            while (rc := proc.poll()) is None:
                now = time.monotonic()
                if now - t_start > ATTEMPT_TIMEOUT:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError(f"attempt timed out: {log}")
                if t0 is None and events.exists():
                    with open(events, "rb") as f:
                        f.seek(offset)
                        t0 = now if _opened(f.read()) else None
                if t0 is not None and now - t0 >= every and progress.made():
                    self._kill(proc, run_dir, kill, t_start)
                    break
                time.sleep(POLL if t0 is None or now - t0 < every else 0.02)
            pending = self._booked(res, kill, rc, run_dir, pending, events, offset)
            if rc is None:
                continue
            if rc == 0:
                self.out(f"  attempt {res.attempts}: finished by itself")
                res.finished = True
                return res
            res.problems.append(f"{name}: attempt {res.attempts} exited {rc}: {self._tail(log, 600)!r}")
            return res
        res.problems.append(f"{name}: not finished after {max_attempts} attempts")
        return res

    def _check_orphans(self, run_dir: Path, pending: list[str], events: Path, offset: int,
                       res: ChainResult) -> None:
        """Temporaries of the previous kill must be gone once an attempt re-opened the run."""
        if not pending or not events.exists():
            return
        with open(events, "rb") as f:
            f.seek(offset)
            if not _opened(f.read()):
                return  # this attempt died before re-opening the run directory: check after the next
        left = [rel for rel in pending if (run_dir / rel).exists()]
        res.orphans += len(left)
        for rel in left:
            res.problems.append(f"{run_dir.name}/{rel}: temporary left by a kill survived the next start")
        pending.clear()

    def compare(self, res: ChainResult, ref: Reference) -> None:
        """Check a finished chain against the reference."""
        left = temporaries(res.run_dir)
        res.orphans += len(left)
        res.problems += [f"{res.run_dir.name}/{rel}: temporary left in the finished run" for rel in left]
        res.comparison = compare(ref.snap, snapshot(res.run_dir))
        res.problems += [f"{res.run_dir.name}: {p}" for p in res.comparison.problems]
        edited = ref.code_changes()
        if edited:  # someone edited the code meanwhile: the runs are not comparable
            res.problems.append(f"source files changed since the reference run: {', '.join(edited)}")
        c = res.comparison
        self.out(f"{res.name}: compared {c.rows} rows (lost {c.lost}, duplicated {c.duplicated}, changed {c.changed}), "
                 f"{c.arrays} parameter arrays in {c.checkpoints} checkpoints with the reference; "
                 f"{len(res.problems)} differences")


@dataclasses.dataclass
class ChainResult:
    name: str
    run_dir: Path
    attempts: int = 0
    kills: list[Kill] = dataclasses.field(default_factory=list)
    orphans: int = 0
    finished: bool = False
    comparison: Comparison = dataclasses.field(default_factory=Comparison)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def resumes(self) -> int:
        return max(self.attempts - 1, 0)


@dataclasses.dataclass
class Totals:
    kills: int = 0
    boundary_kills: int = 0
    random_kills: int = 0
    periodic_kills: int = 0
    resumes: int = 0
    chains: int = 0
    orphans: int = 0
    comparison: Comparison = dataclasses.field(default_factory=Comparison)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def differences(self) -> int:
        return len(self.problems)

    def add(self, res: ChainResult) -> None:
        self.chains += 1
        self.kills += len(res.kills)
        self.boundary_kills += sum(k.kind == "boundary" for k in res.kills)
        self.random_kills += sum(k.kind == "random" for k in res.kills)
        self.periodic_kills += sum(k.kind == "periodic" for k in res.kills)
        self.resumes += res.resumes
        self.orphans += res.orphans
        self.comparison.add(res.comparison)
        self.problems += res.problems


def run_matrix(matrix: Matrix, boundaries: list[str], n_random: int, seed: int, *, random_from: float = 0.0,
               max_chains: int = 6) -> tuple[Reference, Totals]:
    """The boundary chain (it also fills the compilation cache, so that the reference's
    timeline has the speed of the attempts), the reference, then the random kills in as
    few chains as possible (a chain ends when its run finishes). ``random_from``: the
    random moments lie in [random_from * duration, duration]."""
    totals = Totals()
    first = None
    if boundaries:
        matrix.out(f"boundary chain: {len(boundaries)} kills")
        first, rest = matrix.chain("boundaries", Matrix.boundary_kills(boundaries))
        if rest:
            first.problems.append(f"boundary kills {[k.name for k in rest]} did not land: the run finished first")
    ref = matrix.reference()
    matrix.out(f"reference: {describe_reference(ref)}")
    totals.problems += check_reference(ref)
    if first is not None:
        if first.finished:
            matrix.compare(first, ref)
        totals.add(first)
    rng = random.Random(seed)
    todo = sorted(matrix.random_kills(ref, n_random, rng, lo=random_from * ref.seconds), key=lambda k: k.at)
    chains = 0
    while todo and chains < max_chains:
        chains += 1
        name = f"random-{chains}"
        matrix.out(f"{name}: {len(todo)} kills")
        res, todo = matrix.chain(name, todo)
        if res.finished:
            matrix.compare(res, ref)
        totals.add(res)
    if todo:
        totals.problems.append(f"{len(todo)} random kills could not be placed in {max_chains} chains")
    return ref, totals


def differences(ref: Reference, run_dir: Path) -> list[str]:
    """Every way the finished run ``run_dir`` differs from the reference (none: equal)."""
    edited = ref.code_changes()
    problems = compare(ref.snap, snapshot(run_dir)).problems
    if edited:
        problems.append(f"source files changed since the reference run, results not comparable: {', '.join(edited)}")
    return problems


_SHARED: dict[Path, tuple[Matrix, Reference]] = {}


def shared_reference(workdir: Path, out: Callable[[str], None] = print) -> tuple[Matrix, Reference]:
    """One reference run per work folder and process (the tests share it)."""
    key = workdir.resolve()
    if key not in _SHARED:
        matrix = Matrix(workdir, out=out)
        _SHARED[key] = (matrix, matrix.reference())
    return _SHARED[key]


def describe_reference(ref: Reference) -> str:
    its = []
    for n in range(1, ITERATIONS + 1):
        info = ref.snap.train.get(f"iterations/{n:03d}/train.json", {})
        rows = ref.snap.parquet.get(f"iterations/{n:03d}/rationales.parquet", [])
        its.append(f"iteration {n}: {sum(r['kept'] for r in rows)} of {len(rows)} rationales kept, "
                   f"{info.get('steps', 0)} fine-tuning steps")
    return f"{ref.seconds:.1f} s uninterrupted, {len(ref.timeline)} files; " + "; ".join(its)


def base_training_seconds(ref: Reference) -> float:
    """How long the reference's longest stage, base training, took: from the base model's
    appearance to its fine-tuned checkpoint's."""
    when = {rel: t for t, rel in ref.timeline}
    return when["base/model/manifest.msgpack"] - when["base/base_init/manifest.msgpack"]


def check_reference(ref: Reference) -> list[str]:
    """The matrix is only meaningful when every stage runs, fine-tuning included."""
    out = []
    for n in range(1, ITERATIONS + 1):
        if not ref.snap.train.get(f"iterations/{n:03d}/train.json", {}).get("steps"):
            out.append(f"the reference run did not fine-tune in iteration {n} (no rationale kept)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--random", type=int, default=20, metavar="N", help="kills at random moments (default 20)")
    p.add_argument("--boundaries", default="all",
                   help=f"comma-separated stage boundaries to kill at, 'all' or 'none' ({', '.join(BOUNDARIES)})")
    p.add_argument("--seed", type=int, default=20240607, help="seed of the random moments")
    p.add_argument("--workdir", type=Path, default=None, help="work folder (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (always kept on failure)")
    p.add_argument("--no-jax-cache", action="store_true", help="compile from scratch in every process")
    p.add_argument("--periodic", type=float, default=0.5, metavar="F",
                   help="also run the periodic chain, killing every F x the reference's base-training time "
                        "(0: skip it; default 0.5)")
    args = p.parse_args(argv)
    names = (list(BOUNDARIES) if args.boundaries == "all" else
             [] if args.boundaries == "none" else [b.strip() for b in args.boundaries.split(",") if b.strip()])
    unknown = [b for b in names if b not in BOUNDARIES]
    if unknown:
        p.error(f"unknown boundaries {unknown}; known: {', '.join(BOUNDARIES)}")

    t_all = time.monotonic()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kill-matrix-"))
    out = lambda s: print(s, flush=True)  # noqa: E731
    matrix = Matrix(workdir, seed=args.seed, jax_cache=not args.no_jax_cache, out=out)
    out(f"kill matrix: {EXPERIMENT.relative_to(REPO)} shortened (--limit {LIMIT}, {ITERATIONS} iterations, "
        f"2 x 64 byte-level GPT-J, 200 base steps), seed {args.seed}, work folder {workdir}")
    ref, totals = run_matrix(matrix, names, args.random, args.seed)
    if args.periodic > 0 and ref.timeline:
        every = args.periodic * base_training_seconds(ref)
        out(f"periodic chain: a kill every {every:.1f} s (base training took {base_training_seconds(ref):.1f} s)")
        res = matrix.periodic_chain(every)
        if res.finished:
            matrix.compare(res, ref)
        if not any("base/model.partial" in k.snapshots for k in res.kills):
            res.problems.append("periodic chain: no kill landed in base training with a snapshot to resume from")
        totals.add(res)
    c = totals.comparison
    out("")
    out(f"kills: {totals.kills} ({totals.boundary_kills} at stage boundaries, {totals.random_kills} at random moments, "
        f"{totals.periodic_kills} periodic)")
    out(f"resumes: {totals.resumes} in {totals.chains} chains (reference run: {ref.seconds:.1f} s)")
    out(f"rows compared: {c.rows} (lost {c.lost}, duplicated {c.duplicated}, changed {c.changed})")
    out(f"checkpoint parameters compared bit for bit: {c.arrays} arrays in {c.checkpoints} checkpoints")
    out(f"orphan temporaries after the next start: {totals.orphans}")
    out(f"differences: {totals.differences}")
    for line in totals.problems:
        out(f"  - {line}")
    out(f"time: {time.monotonic() - t_all:.0f} s")
    short = totals.random_kills < args.random or totals.boundary_kills < len(names)
    if short:
        out(f"only {totals.random_kills} of {args.random} random and {totals.boundary_kills} of {len(names)} "
            f"boundary kills landed")
    failed = totals.differences > 0 or short
    if failed or args.keep:
        out(f"work folder kept: {workdir}")
    elif args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
