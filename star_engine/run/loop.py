"""The STaR outer loop, as Algorithm 1 of Zelikman et al. (2022).

    M0 <- base model (optionally trained from the task's seed examples)
    for n in 1..N:
        x_i        <- the questions a sampler draws (uniform; or from the per-question ledger)
        T_n        <- a tuner's temperature for M_{n-1} (optional; B-STaR)
        r_i, y_i   <- M_{n-1}(few-shot prompt + x_i)            rationale generation
        r'_i, y'_i <- M_{n-1}(hint prompt + hint(x_i, y_i))      rationalization, for wrong i no filter declines
        D_n <- {(x_i, r_i, y_i) | y_i = y} + {(x_i, r'_i, y) | y'_i = y}    filtered, hint-free x_i
        M_n <- train(M0 or M_{n-1}, D_n, steps(n))
        D_VER <- D_VER + {(x_i, r_i, y_i) labelled right or wrong}   V-STaR's data (optional)
        V <- DPO(M0, pairs of D_VER), when n = N               verifier (V-STaR, Algorithm 1)
        evaluate M_n on dev (at n = N, its samples ranked by V)

Each call below is a stage of :mod:`star_engine.run.stages`: it returns its stored
result when it already ran, so rerunning this function resumes a run. In the code,
``D`` holds the drawn questions x_i, ``kept`` is D_n, and ``M`` / ``M0`` name
checkpoints in the run directory (what the backend loads), not models in memory.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence

import structlog

from ..config import smoke
from ..api import Example
from ..errors import UserError
from .experiment import Experiment
from .labelfree import collapse_stop
from ..rundir.metrics import METRICS_SCHEMA, Evaluated, coverage, dev_accuracy, iteration_rows
from ..rundir.records import Rationale, training_examples
from ..seeds import derive_seed
from .stages import Stages, it_dir
from ..rundir.store import RunStore
from .tuning import tune
from .verifying import due as verifier_due, train_verifier

log = structlog.get_logger("star_engine")


def run_star(exp: Experiment, store: RunStore) -> list[dict]:
    cfg, stages = exp.config, Stages(exp, store)
    N, rat, tr, ev = cfg.experiment.iterations, cfg.rationalization, cfg.training, cfg.evaluation
    all_rows: list[dict] = []
    ledger: list[dict] = []  # the per-question ledger so far (questions.parquet)

    def record(n: int, D: list, rationales: list[Rationale], train: dict, evals: Evaluated, solved: set[str],
               t0: float) -> list[dict]:
        if rationales:
            ledger.extend(stages.ledger(n, D, rationales, ledger))
            stages.save_ledger(ledger)
        rel = f"{it_dir(n)}/metrics.parquet"
        if store.done(rel):
            rows = store.read_rows(rel)
        else:
            rows = iteration_rows(n, rationales, evals, train, coverage(solved, exp.splits[cfg.task.train_split]),
                                  time.perf_counter() - t0, ev.pass_k,
                                  stages.count_tokens([r.rationale for r in rationales]))
            store.write_table(rel, rows, METRICS_SCHEMA)
        all_rows.extend(rows)
        store.write_table("metrics.parquet", all_rows, METRICS_SCHEMA)
        exp.notify("on_iteration_end", run_dir=store.root, iteration=n, metrics=rows,
                            losses=train.get("losses", []))
        log.info("iteration_done", iteration=n, stage_seconds=stages.pop_timings(),
                 prompts_truncated=stages.pop_truncations(),
                 **{f"{r['split']}_accuracy": round(r["accuracy"], 4) for r in rows if r["class"] == "all"})
        return rows

    M0 = stages.base_model()
    M = M0
    if ev.at_start:
        t0 = time.perf_counter()
        exp.notify("on_iteration_start", run_dir=store.root, iteration=0)
        record(0, [], [], {}, stages.evaluate_all(0, M0), set(), t0)

    solved: set[str] = set()  # train questions answered correctly without a hint, so far
    best, stale = -math.inf, 0
    for n in range(1, N + 1):
        t0 = time.perf_counter()
        exp.notify("on_iteration_start", run_dir=store.root, iteration=n)
        D = stages.train_questions(n, ledger)                                 # question sampler
        T = None  # the spec a tuner chose (None: [generation]'s)
        if tr.source == "gold":
            rationales = stages.gold(n, D)
        else:
            T = tune(stages, n, M, D)                                         # temperature (B-STaR)
            R = stages.generate(n, M, D, T)                                   # rationale generation
            right = {r.question_id for r in R if r.correct}
            solved |= right
            wrong = [x for x in D if x.id not in right]                       # answer filter
            Rr = stages.rationalize(n, M, stages.undeclined(n, wrong, R), T) if rat.enabled else []  # rationalization
            rationales = stages.select(n, R + Rr)                             # checker + filters
        kept = training_examples(rationales)
        trained_on = "gold" if tr.source == "gold" else "kept"
        nothing = not kept and not cfg.experiment.smoke
        if nothing:  # a warning, a line under the summary; experiment.stop_when_nothing_kept stops
            log.warning("nothing_kept", iteration=n, questions=len(D), samples=len(rationales),
                        stop=cfg.experiment.stop_when_nothing_kept)
        if not kept and cfg.experiment.smoke:  # --smoke: the training stage runs all the same
            kept, trained_on = training_examples(smoke_gold(stages, n, D)), "gold_fallback"
        init = M0 if tr.restart_from_base else M                           # restart from base
        with exp.calling(exp.schedule, "steps"):
            steps = exp.schedule.steps(n, len(kept), tr.batch_size, tr.grad_accum)
        exp.registry.returned(exp.schedule, "steps", steps, isinstance(steps, numbers.Integral)
                              and not isinstance(steps, bool) and steps >= 0, "an int >= 0")
        steps = int(steps)  # a numpy integer too
        if cfg.experiment.smoke:
            steps = smoke.steps(steps)
        seed = derive_seed(cfg.experiment.seed, n, "train")
        M, train = stages.fine_tune(it_dir(n), init, kept, tr.train_spec(steps, seed), trained_on)
        due = n % ev.every == 0 or n == N
        V = train_verifier(stages, n, M, M0) if verifier_due(cfg, n, due) else None  # V-STaR
        evals = stages.evaluate_all(n, M, V.scorer(stages, n) if V else None) if due else Evaluated()  # evaluate
        if T is not None:
            train = {**train, "temperature": T.temperature}
        rows = record(n, D, rationales, train, evals, solved, t0)

        acc = dev_accuracy(rows, ev.splits[0])
        patience = cfg.experiment.early_stop_patience
        if acc is not None and patience:
            best, stale = (acc, 0) if acc > best else (best, stale + 1)
            if stale >= patience:
                log.info("early_stop", iteration=n, best_accuracy=best, patience=patience)
                break
        if collapse_stop(cfg, all_rows, n):  # agreement up, held-out accuracy down (SRT's collapse)
            break
        if nothing and cfg.experiment.stop_when_nothing_kept:
            log.info("stop_nothing_kept", iteration=n)
            break
    return all_rows


def smoke_gold(stages: Stages, n: int, questions: Sequence[Example]) -> list[Rationale]:
    """Iteration ``n`` of a smoke run kept nothing: the gold completions of its questions
    (``stages.gold``, stored as ``smoke_gold.parquet``; the direct ones when the task has no gold
    rationales) to train on, with a ``smoke_gold_fallback`` warning."""
    direct = stages.cfg.task.direct
    try:
        rows = stages.gold(n, questions, "smoke_gold")
    except UserError as e:
        if direct:
            raise UserError(f"--smoke: iteration {n} kept nothing, and the task has no gold completions to train "
                            f"on instead: {e}") from None
        try:  # e.g. CommonsenseQA: no gold rationales, but its answers
            rows, direct = stages.gold(n, questions, "smoke_gold", direct=True), True
        except UserError as e2:
            raise UserError(f"--smoke: iteration {n} kept nothing, and the task has no gold completions to train "
                            f"on instead: {e2}") from None
    what = "gold answers (the task has no gold rationales)" if direct != stages.cfg.task.direct else \
        "gold completions"
    log.warning("smoke_gold_fallback", iteration=n, examples=len(rows), completions=what,
                note="--smoke: nothing was kept, so the training stage trains on the task's gold completions "
                     "instead (metrics.parquet: trained_on = gold_fallback)")
    return rows
