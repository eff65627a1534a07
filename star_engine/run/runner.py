"""Starting or resuming a run: every check first, then the lock, then the run directory's
self-description, then the loop.

``preflight`` is the one validation path: ``validate`` calls it and reports, ``run``
calls it before it writes anything (the backend's own checks included, through the
optional ``Backend.validate_run``), so that whatever ``validate`` accepts ``run``
does not refuse after having written something.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import structlog

from .. import ui
from ..machine import cpu_model, expected_time, ran_on, usable_cpus
from ..version import __version__
from ..rundir import layout as rundir, runlock
from ..capabilities import MeasuresSpeed, NeedsReferences, Starts, ValidatesEngine, ValidatesRun
from ..api import MultiProcess
from ..errors import UserError
from .experiment import Experiment, config_hash
from .labelfree import collapse_note
from .loop import run_star
from ..rundir.metrics import nothing_kept_note
from ..rundir.records import MAX_ROWS
from ..seeds import derive_seed
from ..rundir.fsio import json_bytes
from ..rundir.store import RunStore, clean_temporaries
from .trial import try_components
from .verdicts import log_skipped

log = structlog.get_logger("star_engine")


def check_backend(exp: Experiment) -> None:
    """The backend's checks of what this run will ask of it (``Backend.validate_run``, when it
    has one): the generation specs the stages use, and the training specs (``steps`` 0 where
    the schedule decides per iteration)."""
    backend, cfg = exp.backend, exp.config
    if not isinstance(backend, ValidatesRun):
        return
    stop = tuple(exp.task.stop)
    generation = {"generation": cfg.generation.gen_spec(stop), "evaluation": cfg.evaluation.gen_spec(cfg.generation, stop)}
    seed, bt, tr = cfg.experiment.seed, cfg.base_training, cfg.training
    training = {"base_training": bt.train_spec(bt.steps, derive_seed(seed, 0, "base_training"))} if bt.steps else {}
    training["training"] = tr.train_spec(0, derive_seed(seed, 1, "train"))
    if cfg.verifier.enabled:
        training["verifier"] = cfg.verifier.train_spec()
    with exp.calling(backend, "validate_run"):
        backend.validate_run(generation=generation, training=training)


def check_engine(exp: Experiment) -> None:
    """The generation engine's checks of the run's backend (``GenerationEngine.validate``, optional:
    e.g. that the backend exports what the server loads), before anything is written or started."""
    engine = exp.engine
    if engine is None:
        return
    if isinstance(exp.backend, MultiProcess) and exp.backend.process_count() > 1:
        raise UserError("generation.engine: a generation engine samples from one process; this run's backend runs "
                        f"{exp.backend.process_count()} processes", key="generation.engine")
    if isinstance(engine, ValidatesEngine):
        with exp.calling(engine, "validate"):
            engine.validate(exp.backend)


def check_volume(exp: Experiment) -> None:
    """One stage's generations (questions x samples per question) fit in one record file
    (``records.MAX_ROWS``): the requests are built, and their rows kept, in memory at once."""
    cfg, splits = exp.config, exp.splits
    if not splits:  # validate without data: counted when the run loads it
        return
    train, g = len(splits.get(cfg.task.train_split, ())), cfg.generation
    asked = [("generation.samples_per_question", g.samples_per_question,
              min(g.n_train_samples or train, train), "train questions")]
    asked += [("evaluation.samples_per_question", max(cfg.evaluation.samples_per_question, 1), len(splits[s]),
               f"{s} questions") for s in cfg.evaluation.splits if s in splits]
    for key, k, n, what in asked:
        if k * n > MAX_ROWS:
            raise UserError(f"{key}: {k:,} samples x {n:,} {what} = {k * n:,} generations in one stage, more than "
                            f"the {MAX_ROWS:,} a stage may hold", key=key)


def check_references(exp: Experiment) -> None:
    """A tuner that reads each question's reference solution (``NeedsReferences``: B-STaR's
    ``balance``) has a task that writes one: its gold completion of a training question."""
    tuner, cfg = exp.tuner, exp.config
    questions = [ex for ex in exp.splits.get(cfg.task.train_split, ()) if ex.answer]
    if not (isinstance(tuner, NeedsReferences) and tuner.needs_references and questions):
        return
    try:
        with exp.calling(exp.task, "gold_completion"):
            exp.task.gold_completion(questions[0], cfg.task.direct)
    except UserError as e:
        raise UserError(f"generation.tuner.reference: tuner {cfg.generation.tuner['name']!r} counts each question's "
                        f"reference solution, and the task has none ({e}); set generation.tuner.reference = false "
                        f"to tune without it", key="generation.tuner.reference") from None


def preflight(exp: Experiment) -> rundir.RunDir:
    """Every check a run makes before it writes anything (reads only): the stages' volume, the
    components tried on a few questions (``trial``), the backend's, then the run directory's.
    ``validate`` and ``run`` both call it."""
    check_volume(exp)
    try_components(exp)
    check_references(exp)
    check_backend(exp)
    check_engine(exp)
    return rundir.inspect(exp.config.as_dict(), exp.defaults, exp.options)


def open_run_dir(exp: Experiment, state: rundir.RunDir, toml_path: Path) -> RunStore:
    """Write the run directory's self-description (``state`` was checked under the lock)."""
    root, p, cfg = state.root, exp.processes, exp.config.as_dict()
    event_dir = root if p.primary else None  # one event log, process 0's
    describe = {"config_sha256": config_hash(cfg), "star_engine": __version__,
                "plugins": exp.registry.requirements()}
    # a first start killed before config.json may have left some too
    removed = p.primary_does("clean temporaries", lambda: clean_temporaries(root)) or 0
    store = RunStore(root, describe, manifest=state.manifest, processes=p)
    ui.configure_logging(event_dir)
    if state.resume:
        log.info("resume", run_dir=str(root), temporaries_removed=removed)
    else:
        store.write_bytes(root / "experiment.toml", toml_path.read_bytes())
        log.info("start", run_dir=str(root))
    # The resolved config is rewritten on resume so a raised iteration count is recorded.
    store.write_bytes(root / "config.json", json_bytes(cfg))
    with exp.calling(exp.backend, "describe"):
        backend = exp.backend.describe()
    store.set_header(star_engine_version=__version__, config_sha256=describe["config_sha256"],
                     experiment=exp.config.experiment.name, python=sys.version.split()[0],
                     platform=platform.platform(), plugins=exp.registry.describe(),
                     requirements=exp.registry.requirements(), backend=backend, component_options=exp.options,
                     finished=False)
    store.write_bytes(root / "requirements.txt", ("\n".join(exp.registry.requirements()) + "\n").encode())
    return store


def prepare_run_dir(exp: Experiment, toml_path: Path) -> RunStore:
    """Lock the run directory (process 0, for all), check it again under the lock (another run
    may have changed it since ``preflight``), then open it."""
    p = exp.processes
    if p.primary:
        runlock.lock(exp.run_dir)  # before the first write; refused at once when another run holds it
    p.sync("run directory locked")
    state = rundir.inspect(exp.config.as_dict(), exp.defaults, exp.options)
    # Several processes: all of them look at the folder before process 0 changes it.
    p.sync("start")
    return open_run_dir(exp, state, toml_path)


def measure_speed(exp: Experiment) -> float | None:
    """This machine's fp32 matmul GFLOP/s, when the backend measures it (``Backend.matmul_gflops``),
    and the time the run expects here when the experiment says what it took at a given speed
    (``experiment.expected_minutes`` at ``expected_gflops``; not for ``--smoke``, which changes
    the work): printed before any training begins."""
    if not isinstance(exp.backend, MeasuresSpeed):
        return None
    with exp.calling(exp.backend, "matmul_gflops"):
        gflops = round(float(exp.backend.matmul_gflops()), 1)
    e = exp.config.experiment
    if gflops > 0 and e.expected_minutes and not e.smoke and not ui.is_quiet() and exp.processes.primary:
        ui.print_text(expected_time(e.expected_minutes, e.expected_gflops, gflops))
    return gflops if gflops > 0 else None


def run(exp: Experiment, toml_path: Path) -> list[dict]:
    with exp.processes.stopping_others_on_failure():  # the others stop at once, not at a timeout
        return _run(exp, toml_path)


def _run(exp: Experiment, toml_path: Path) -> list[dict]:
    started = time.perf_counter()
    preflight(exp)
    if isinstance(exp.backend, Starts):  # the optional Backend.start: never in validate
        with exp.calling(exp.backend, "start"):
            exp.backend.start()
    gflops = measure_speed(exp)
    store = prepare_run_dir(exp, toml_path)
    if gflops:  # in the run's event log, which opens with its directory
        log.info("machine_speed", cpu=cpu_model(), cpus=usable_cpus(), gflops=gflops)
    log_skipped(exp.panel)  # gold answers the checkers skipped when the data was loaded
    exp.notify("on_run_start", run_dir=store.root, config=exp.config.as_dict())
    t0 = time.perf_counter()
    if exp.engine is not None:  # generation.engine: started now, stopped however the run ends
        with exp.calling(exp.engine, "start"):
            exp.engine.start(store.root, exp.backend)
    try:
        rows = run_star(exp, store)
    finally:
        if exp.engine is not None:
            with exp.calling(exp.engine, "close"):
                exp.engine.close()
    store.set_header(finished=True)
    log.info("run_finished", run_dir=str(store.root), seconds=round(time.perf_counter() - t0, 1),
             cpu=cpu_model(), cpus=usable_cpus(), gflops=gflops)
    from ..report.report import write_report  # matplotlib is imported only when a report is made

    exp.processes.primary_does("write report", lambda: write_report(store.root))
    exp.notify("on_run_end", run_dir=store.root, metrics=rows)
    if not ui.is_quiet():
        notes = [n for n in (collapse_note(exp.config, rows), nothing_kept_note(rows)) if n]
        notes.append(ran_on(time.perf_counter() - started, gflops))  # timings differ from one CPU to another
        ui.print_summary(rows, "\n".join(notes))  # the collapse guard's stop; iterations that kept nothing
    return rows
