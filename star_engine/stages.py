"""The stages of one STaR iteration, each resumable and idempotent.

A stage first asks the store whether its output is already there (and intact);
if so it returns it without touching the model. Generation is split into
fixed chunks, each stored on its own, so a killed run loses at most one chunk.
Every random choice takes its seed from (experiment seed, iteration, question,
sample, purpose), never from batch position, so results do not depend on
batching or on where a run was interrupted.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

import pyarrow.parquet as pq
import structlog

from . import ui
from .api import CheckContext, Example, GenRequest, GenSpec, Progress, TrainExample, TrainResult, TrainSpec, Verdict
from .capabilities import RecordsCheckpoints, SeesRejected, Trims
from .experiment import Experiment, prompt_kinds
from .ledger import LEDGER_SCHEMA, ledger_rows
from .metrics import Evaluated
from .questions import draw
from .records import GREEDY, UNSELECTED, Chunk, Evaluation, Rationale
from .seeds import coin, derive_seed
from .store import RunStore, disk_full, loading_checkpoint
from .tokens import Truncation, count_tokens
from .verdicts import Judge

if TYPE_CHECKING:
    from .verifying import Verifying

log = structlog.get_logger("star_engine")


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def it_dir(n: int) -> str:
    return f"iterations/{n:03d}"


class Stages:
    def __init__(self, exp: Experiment, store: RunStore):
        self.exp, self.store, self.cfg = exp, store, exp.config
        self.seed = self.cfg.experiment.seed
        self.task, self.backend = exp.task, exp.backend
        self.stop = tuple(self.task.stop)
        self.sample_spec = self.cfg.generation.gen_spec(self.stop)
        self.eval_spec = self.cfg.evaluation.gen_spec(self.cfg.generation, self.stop)
        self.kind, self.hint_kind = prompt_kinds(self.cfg)
        reward = (exp.reward, self.cfg.task.reward["name"]) if exp.reward is not None else None
        self.judge = Judge(exp.checker, exp.checker_name, exp.panel, exp.registry, reward)
        self.truncation = Truncation(self.backend, exp.registry)  # the prompts the backend cuts, per stage
        self.timings: dict[str, float] = {}
        # questions.parquet is rewritten as the loop goes, so whether to rewrite it is decided
        # from its row count read here, before any process can change it, and from the counts
        # written since: every process decides alike (star_engine.procs).
        self._ledger_on_disk = -1
        if store.done("questions.parquet"):
            self._ledger_on_disk = pq.ParquetFile(store.root / "questions.parquet").metadata.num_rows
        store.processes.sync("ledger counted")

    # -- references to checkpoints (relative inside the run directory) -------------
    def _ref(self, path: str | Path) -> str:
        p = Path(path).resolve()
        root = self.store.root.resolve()
        return str(p.relative_to(root)) if p.is_relative_to(root) else str(p)

    def path(self, ref: str) -> str:
        return str(self.store.root / ref) if not Path(ref).is_absolute() else ref

    def checkpoint_id(self, ref: str) -> str:
        return self._checkpoint_id(self.path(ref))

    def _checkpoint_id(self, path: str) -> str:
        with self.exp.calling(self.backend, "checkpoint_id"):
            return self.backend.checkpoint_id(path)

    # -- the task's methods, a failure named after its plugin ---------------------------
    def _prompt(self, kind: str) -> str:
        with self.exp.calling(self.task, "prompt"):
            return self.task.prompt(kind)

    def _context(self, ex: Example) -> str:
        with self.exp.calling(self.task, "context"):
            return self.task.context(ex)

    def _trim(self, text: str) -> str:
        """The part of a generation that is checked and stored (the optional ``Task.trim``)."""
        if not isinstance(self.task, Trims):
            return text
        with self.exp.calling(self.task, "trim"):
            return self.task.trim(text)

    # -- timing --------------------------------------------------------------------
    def _timed(self, name: str, start: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    def pop_truncations(self) -> dict[str, int]:
        """Prompts the backend cut per stage since the last call (``tokens.Truncation``)."""
        return self.truncation.pop()

    def pop_timings(self) -> dict[str, float]:
        """Seconds spent in each stage (generate, rationalize, train, evaluate) since the
        last call, rounded to 0.01 s; stages replayed from stored files take ~0."""
        out = {k: round(v, 2) for k, v in self.timings.items()}
        self.timings.clear()
        return out

    # -- generation in stored chunks ----------------------------------------------
    def _generate(self, rel_dir: str, prompts: Sequence[str], seeds: Sequence[int], spec: GenSpec,
                  model: str, what: str) -> list[str]:
        size = self.cfg.generation.chunk_size
        texts: list[str] = []
        with ui.progress(what, len(prompts)) as advance:
            for i, start in enumerate(range(0, len(prompts), size)):
                rel = f"{rel_dir}/chunk-{i:05d}.parquet"
                if not self.store.done(rel):
                    reqs = [GenRequest(p, s) for p, s in zip(prompts[start:start + size], seeds[start:start + size])]
                    with loading_checkpoint(Path(self.path(model)), not Path(model).is_absolute()), \
                            self.exp.calling(self.backend, "generate"):
                        out = self.backend.generate(self.path(model), reqs, spec, progress=advance)
                    if len(out) != len(reqs):
                        raise RuntimeError(f"backend returned {len(out)} texts for {len(reqs)} requests")
                    self.store.write_records(rel, [Chunk(index=start + j, text=t) for j, t in enumerate(out)], Chunk)
                else:
                    advance(min(size, len(prompts) - start))
                texts.extend(c.text for c in self.store.read_records(rel, Chunk))
        return texts

    def _finish(self, rel: str, rows: list, kind: type, chunk_dir: str | None, omit: tuple[str, ...] = ()) -> list:
        self.store.write_records(rel, rows, kind, omit)
        if chunk_dir:
            self._drop_chunks(chunk_dir)
        return rows

    def _stored(self, rel: str, chunk_dir: str, kind: type) -> list:
        """A finished stage's rows; chunks left by a run killed just after the stage's
        file was written are dropped now (their rows are in that file)."""
        if (self.store.root / chunk_dir).exists():
            self._drop_chunks(chunk_dir)
        return self.store.read_records(rel, kind)

    def _drop_chunks(self, chunk_dir: str) -> None:
        self.store.forget(chunk_dir + "/")  # the chunks are inside the stage's file
        self.store.remove(chunk_dir)

    # -- the train questions of an iteration ----------------------------------------
    def train_questions(self, n: int, ledger: Sequence[dict]) -> list[Example]:
        """The questions iteration ``n`` draws (``star_engine.questions``), in the split's order."""
        qs, sampler = self.exp.splits["train"], self.cfg.generation.sampler
        k = min(self.cfg.generation.n_train_samples or len(qs), len(qs))
        return draw(qs, k, self.exp.sampler, sampler.get("name", ""), n, ledger, self.seed, self.exp.registry)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text: the backend's optional ``count_tokens``, else UTF-8 bytes."""
        return count_tokens(self.backend, texts, self.exp.registry)

    def ledger(self, n: int, questions: Sequence[Example], rationales: Sequence[Rationale],
               before: Sequence[dict]) -> list[dict]:
        """Iteration ``n``'s rows of the per-question ledger (``star_engine.ledger``)."""
        rel = f"{it_dir(n)}/questions.parquet"
        if self.store.done(rel):
            return self.store.read_rows(rel)
        rows = ledger_rows(n, questions, rationales, before, self.count_tokens)
        self.store.write_table(rel, rows, LEDGER_SCHEMA)
        return rows

    def save_ledger(self, rows: Sequence[dict]) -> None:
        """The run's ledger so far, ``questions.parquet``: written when it holds fewer rows (a
        resumed run replaying finished iterations leaves the whole file alone). The count is
        this object's, not the file's: another process may be rewriting the file meanwhile."""
        if len(rows) > self._ledger_on_disk:
            self.store.write_table("questions.parquet", list(rows), LEDGER_SCHEMA)
            self._ledger_on_disk = len(rows)

    def stored_context(self, ex: Example) -> str:
        """``ex``'s hint-free prompt as a rationale of it is stored (and trained on)."""
        return self._stored_prompt(self._context(ex), self.kind)

    def _stored_prompt(self, context: str, kind: str) -> str:
        return (self._prompt(kind) + context) if self.cfg.task.few_shot_train else context

    def _judge(self, text: str, gold: str, where: CheckContext) -> tuple[str, str | None, Verdict]:
        """(the generation as the task keeps it, the task's extraction, the verdict that decides:
        ``verdicts.Judge``'s, told ``where`` the generation comes from)."""
        text = self._trim(text)
        with self.exp.calling(self.task, "extract"):
            extracted = self.task.extract(text)
        return text, extracted, self.judge(text, extracted, gold, where)

    def where(self, n: int, ex: Example, s: int, stage: str, split: str = "train") -> CheckContext:
        return CheckContext(self.seed, n, ex.id, s, stage, split)

    def _row(self, n: int, ex: Example, s: int, text: str, stored: str, full: str, seed: int, hinted: bool,
             model_id: str, cut: bool | None, leaks: Sequence[str] = ()) -> Rationale:
        stage = "rationalize" if hinted else "generate"
        text, _, verdict = self._judge(text, ex.answer, self.where(n, ex, s, stage))
        return _rationale(n, ex, s, stored, text, verdict, was_hinted=hinted, checker=self.judge.name_for(stage),
                          model_checkpoint=model_id, prompt_hash=prompt_hash(full), seed=seed,
                          leak_strings=tuple(leaks), prompt_truncated=cut)

    # -- 1. rationale generation ----------------------------------------------------
    def generate(self, n: int, model: str, questions: Sequence[Example], spec: GenSpec | None = None
                 ) -> list[Rationale]:
        """``generation.samples_per_question`` rationales per question, sampled by ``spec``
        (default: ``[generation]``'s; a tuner's temperature, ``tuning.tune``)."""
        rel = f"{it_dir(n)}/generated.parquet"
        if self.store.done(rel):
            return self._stored(rel, f"{it_dir(n)}/generate", Rationale)
        t0, k = time.perf_counter(), self.cfg.generation.samples_per_question
        items = [(ex, s) for ex in questions for s in range(k)]
        prefix = self._prompt(self.kind)
        prompts = [prefix + self._context(ex) for ex, _ in items]
        seeds = [derive_seed(self.seed, n, ex.id, s, "generate") for ex, s in items]
        spec = spec or self.sample_spec
        cut = self.truncation.flags(prompts, spec, "generate", n)
        texts = self._generate(f"{it_dir(n)}/generate", prompts, seeds, spec, model,
                               f"iter {n}: generate")
        mid = self.checkpoint_id(model)
        rows = [self._row(n, ex, s, text, self._stored_prompt(self._context(ex), self.kind), full, seed,
                          False, mid, c)
                for (ex, s), text, full, seed, c in zip(items, texts, prompts, seeds, cut)]
        self.judge.flush("generate", n)
        self._timed("generate", t0)
        return self._finish(rel, rows, Rationale, f"{it_dir(n)}/generate", UNSELECTED)

    # -- 3. rationalization ---------------------------------------------------------
    def rationalize(self, n: int, model: str, wrong: Sequence[Example], spec: GenSpec | None = None
                    ) -> list[Rationale]:
        rel = f"{it_dir(n)}/rationalized.parquet"
        if self.store.done(rel):
            return self._stored(rel, f"{it_dir(n)}/rationalize", Rationale)
        t0, r = time.perf_counter(), self.cfg.rationalization
        chosen = [ex for ex in wrong if coin(r.p_rationalization, self.seed, n, ex.id, "rationalize")]
        k = self.cfg.generation.samples_per_question
        items = [(ex, s) for ex in chosen for s in range(k)]
        prefix = self._prompt(self.hint_kind)
        hint = self.exp.hint
        assert hint is not None  # rationalization has its hint formatter (experiment.build)
        with self.exp.calling(hint, "context"):
            hinted = [hint.context(self.task, ex) for ex, _ in items]
        prompts = [prefix + h for h in hinted]
        seeds = [derive_seed(self.seed, n, ex.id, s, "rationalize") for ex, s in items]
        spec = spec or self.sample_spec
        cut = self.truncation.flags(prompts, spec, "rationalize", n)
        texts = self._generate(f"{it_dir(n)}/rationalize", prompts, seeds, spec, model,
                               f"iter {n}: rationalize")
        mid = self.checkpoint_id(model)
        rows = []
        for (ex, s), text, h, full, seed, c in zip(items, texts, hinted, prompts, seeds, cut):
            # Stored as if no hint had been given, unless p_show_hint_save says otherwise.
            show = coin(r.p_show_hint_save, self.seed, n, ex.id, s, "show_hint")
            stored = (self._stored_prompt(h, self.hint_kind) if show
                      else self._stored_prompt(self._context(ex), self.kind))
            with self.exp.calling(hint, "leak_strings"):
                leaks = hint.leak_strings(self.task, ex)
            rows.append(self._row(n, ex, s, text, stored, full, seed, True, mid, c, leaks))
        self.judge.flush("rationalize", n)
        self._timed("rationalize", t0)
        return self._finish(rel, rows, Rationale, f"{it_dir(n)}/rationalize", UNSELECTED)

    # -- 2. + filters: what goes into the fine-tuning set ---------------------------
    def history(self, n: int) -> list[Rationale]:
        rows: list[Rationale] = []
        for m in range(1, n):
            rel = f"{it_dir(m)}/rationales.parquet"
            if self.store.done(rel):
                rows.extend(r for r in self.store.read_records(rel, Rationale) if r.kept)
        return rows

    def select(self, n: int, rows: Sequence[Rationale]) -> list[Rationale]:
        rel = f"{it_dir(n)}/rationales.parquet"
        if self.store.done(rel):
            return self.store.read_records(rel, Rationale)
        rows = [replace(r, kept=r.correct, rejected_by=None if r.correct else "checker") for r in rows]
        history = [r.candidate() for r in self.history(n)]
        for name, flt in self.exp.filters:
            alive = [i for i, r in enumerate(rows) if r.kept]
            candidates = [rows[i].candidate() for i in alive]
            if isinstance(flt, SeesRejected):  # a group filter: the question's other samples too
                others = [r.candidate() for r in rows if not r.kept]
                with self.exp.calling(flt, "keep_among"):
                    flags = flt.keep_among(candidates, others, history)
            else:
                with self.exp.calling(flt, "keep"):
                    flags = flt.keep(candidates, history)
            if len(flags) != len(alive):
                raise RuntimeError(f"filter '{name}' returned {len(flags)} flags for {len(alive)} candidates")
            for i, ok in zip(alive, flags):
                if not ok:
                    rows[i] = replace(rows[i], kept=False, rejected_by=name)
        self.store.write_records(rel, rows, Rationale)
        return rows

    def gold(self, n: int, questions: Sequence[Example], name: str = "rationales",
             direct: bool | None = None) -> list[Rationale]:
        """Source "gold": the training set is the dataset's own completions (``rationales.parquet``;
        ``name``: another file of the iteration, ``direct``: other completions than task.direct's)."""
        rel = f"{it_dir(n)}/{name}.parquet"
        if self.store.done(rel):
            return self.store.read_records(rel, Rationale)
        direct = self.cfg.task.direct if direct is None else direct
        rows = []
        for ex in questions:
            ctx = self._stored_prompt(self._context(ex), self.kind)
            with self.exp.calling(self.task, "gold_completion"):
                completion = self.task.gold_completion(ex, direct)
            rows.append(_rationale(n, ex, 0, ctx, completion, Verdict(ex.answer, True),
                                   was_hinted=False, kept=True, checker="gold", model_checkpoint="",
                                   prompt_hash=prompt_hash(ctx), seed=0))
        self.store.write_records(rel, rows, Rationale)
        return rows

    # -- 4. fine-tuning ---------------------------------------------------------------
    def fine_tune(self, rel_dir: str, init: str, examples: Sequence[TrainExample], spec: TrainSpec,
                  trained_on: str = "kept") -> tuple[str, dict[str, Any]]:
        """Train ``examples`` from ``init`` (``train.json`` records it, with ``trained_on``: what the
        examples are, for ``metrics.parquet``)."""
        def train(out: Path, advance: Progress) -> TrainResult:
            return self.backend.train(self.path(init), out, examples, spec, progress=advance)

        return self.trained(rel_dir, init, spec.steps, len(examples), trained_on, ("train", train))

    def trained(self, rel_dir: str, init: str, steps: int, count: int, trained_on: str,
                job: tuple[str, Callable[[Path, Progress], TrainResult]]) -> tuple[str, dict[str, Any]]:
        """A training stage, resumable: ``job`` = (the backend's method, a call of it writing
        ``<rel_dir>/model`` from ``init``) on ``count`` items in ``steps`` steps, recorded in
        ``<rel_dir>/train.json``; none (``init`` recorded) when there are no steps or items."""
        rel = f"{rel_dir}/train.json"
        model_rel = f"{rel_dir}/model"
        if self.store.done(rel):
            info = self.store.read_json(rel)
            if info["checkpoint"] != model_rel or self.store.checkpoint_done(model_rel, self._checkpoint_id):
                return self._recorded(info, model_rel)
            self.store.forget(rel)
        t0 = time.perf_counter()
        if steps == 0 or not count:
            info = {"checkpoint": init, "checkpoint_id": self.checkpoint_id(init), "steps": 0, "tokens": 0,
                    "losses": [], "examples": count}
        else:
            self.store.remove(model_rel)  # a stale, unrecorded attempt
            with ui.progress(f"{rel_dir}: train", steps, "step") as advance, disk_full(self.store.root / model_rel), \
                    loading_checkpoint(Path(self.path(init)), not Path(init).is_absolute()), \
                    self.exp.calling(self.backend, job[0]):
                res = job[1](self.store.root / model_rel, advance)
            self.store.record_checkpoint(model_rel, res.checkpoint_id)
            info = {"checkpoint": model_rel, "checkpoint_id": res.checkpoint_id, "steps": res.steps,
                    "tokens": res.tokens, "losses": list(res.losses), "examples": count}
        info["seconds"] = time.perf_counter() - t0
        info["trained_on"] = trained_on
        self.store.write_json(rel, info)
        self._timed("train", t0)
        return self._recorded(info, model_rel)

    def _recorded(self, info: dict[str, Any], model_rel: str) -> tuple[str, dict[str, Any]]:
        """The stage's ``train.json`` is written: when it trained ``model_rel``, the backend may
        drop what it kept to redo the stage (``Backend.checkpoint_recorded``)."""
        if isinstance(self.backend, RecordsCheckpoints) and info["checkpoint"] == model_rel:
            with self.exp.calling(self.backend, "checkpoint_recorded"):
                self.backend.checkpoint_recorded(self.path(model_rel))
        return info["checkpoint"], info

    def base_model(self) -> str:
        """The base model: the backend's, or one trained from the task's seed examples."""
        rec = self.store.manifest.get("base_checkpoint")
        if rec and not self.store.checkpoint_done(rec, self._checkpoint_id):
            self.store.manifest["checkpoints"].pop(rec, None)  # damaged (and removed) or gone: written again
        with disk_full(self.store.root / "base"), self.exp.calling(self.backend, "base"):
            base = self.backend.base(self.store.root / "base", self.seed)
        init = self._ref(base)
        if not Path(init).is_absolute() and init not in self.store.manifest["checkpoints"]:
            self.store.record_checkpoint(init, self.checkpoint_id(init))
            self.store.set_header(base_checkpoint=init)
        bt = self.cfg.base_training
        if bt.steps == 0:
            return init
        with self.exp.calling(self.task, "seed_examples"):
            seed_examples = self.task.seed_examples()
        ref, _ = self.fine_tune("base", init, seed_examples,
                                bt.train_spec(bt.steps, derive_seed(self.seed, 0, "base_training")), "seed")
        return ref

    # -- 5. evaluation ------------------------------------------------------------------
    def evaluate(self, n: int, model: str, split: str) -> list[Evaluation]:
        """The greedy (``[evaluation]``) answers to every question of ``split``."""
        return self._evaluate(n, model, split, 0, self.eval_spec)

    def evaluate_sampled(self, n: int, model: str, split: str) -> list[Evaluation]:
        """``evaluation.samples_per_question`` answers per question of ``split``, sampled at
        ``evaluation.sample_temperature`` (pass@k and majority vote)."""
        ev = self.cfg.evaluation
        spec = ev.sampled_spec(self.cfg.generation, self.stop)
        return self._evaluate(n, model, split, ev.samples_per_question, spec)

    def _evaluate(self, n: int, model: str, split: str, k: int, spec: GenSpec) -> list[Evaluation]:
        """``k`` sampled answers per question (``eval_<split>_samples.parquet``, a ``sample``
        column), or with ``k`` 0 the one greedy answer (``eval_<split>.parquet``)."""
        name = f"eval_{split}_samples" if k else f"eval_{split}"
        rel = f"{it_dir(n)}/{name}.parquet"
        if self.store.done(rel):
            return self._stored(rel, f"{it_dir(n)}/{name}", Evaluation)
        t0, examples = time.perf_counter(), self.exp.splits[split]
        # no_prompt drops the few-shot prompt once the model has been fine-tuned (as the original).
        prefix = "" if (self.cfg.evaluation.no_prompt and n > 0) else self._prompt(self.kind)
        items = [(ex, s) for ex in examples for s in range(k or 1)]
        prompts = [prefix + self._context(ex) for ex, _ in items]
        seeds = [derive_seed(self.seed, n, ex.id, split, s, "evaluate_sample") if k else
                 derive_seed(self.seed, n, ex.id, split, "evaluate") for ex, s in items]
        what = f"evaluate {split}{' (sampled)' if k else ''}"
        cut = self.truncation.flags(prompts, spec, what, n)
        texts = self._generate(f"{it_dir(n)}/{name}", prompts, seeds, spec, model, f"iter {n}: {what}")
        mid = self.checkpoint_id(model)
        rows = []
        for (ex, s), text, full, c in zip(items, texts, prompts, cut):
            where = self.where(n, ex, s, "evaluate_sampled" if k else "evaluate", split)
            text, extracted, v = self._judge(text, ex.answer, where)
            rows.append(Evaluation(question_id=ex.id, cls=ex.cls, iteration=n, sample=s if k else None, split=split,
                                   generation=text, predicted=v.predicted, gold=ex.answer, correct=bool(v.correct),
                                   checker=self.exp.checker_name, model_checkpoint=mid, prompt_hash=prompt_hash(full),
                                   verdicts=self.judge.others(split, ex, text, extracted, v, where),
                                   prompt_truncated=c))
        self.judge.flush("evaluate_sampled" if k else "evaluate", n, split)
        self._timed("evaluate", t0)
        return self._finish(rel, rows, Evaluation, f"{it_dir(n)}/{name}", () if k else GREEDY)

    def evaluate_all(self, n: int, model: str, verifier: Verifying | None = None) -> Evaluated:
        """Every evaluation split, greedy, and sampled when ``evaluation.samples_per_question`` > 1
        (or a ``verifier`` ranks the samples: ``verifying.Verifying``, its scores of them)."""
        splits = self.cfg.evaluation.splits
        greedy = {s: self.evaluate(n, model, s) for s in splits}
        if self.cfg.evaluation.samples_per_question <= 1 and verifier is None:
            return Evaluated(greedy)
        sampled = {s: self.evaluate_sampled(n, model, s) for s in splits}
        scores = {s: verifier.score(self, n, s, sampled[s]) for s in splits} if verifier is not None else {}
        return Evaluated(greedy, sampled, scores)


def _rationale(n: int, ex: Example, s: int, prompt: str, text: str, verdict: Verdict, **rest: Any) -> Rationale:
    """Sample ``s`` of iteration ``n`` for question ``ex``: ``text`` stored with ``prompt``, judged ``verdict``."""
    return Rationale(question_id=ex.id, cls=ex.cls, iteration=n, sample=s, prompt=prompt, rationale=text,
                     predicted=verdict.predicted, gold=ex.answer, correct=bool(verdict.correct), **rest)
