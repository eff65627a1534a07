"""The stages of one STaR iteration, each resumable and idempotent, in the order of Algorithm 1
(``loop.run_star``): rationale generation, rationalization, selection (checker and filters),
fine-tuning, evaluation; what they stand on is ``stagebase.StageBase``.

A stage first asks the store whether its output is already there (and intact); if so it returns
it without touching the model.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from .. import ui
from ..api import Candidate, Example, Progress, TrainExample, Verdict
from ..capabilities import DeclinesQuestions, RecordsCheckpoints, SeesRejected
from ..jobs import GenSpec, TrainResult, TrainSpec
from ..rundir.metrics import Evaluated
from ..rundir.records import GREEDY, UNSELECTED, Evaluation, Rationale, VerifierScore
from ..seeds import coin, derive_seed
from .stagebase import StageBase, it_dir, prompt_hash, rationale_of
from ..rundir.store import disk_full

__all__ = ["Scorer", "Stages", "derive_seed", "it_dir", "prompt_hash"]

Scorer = Callable[[str, Sequence[Evaluation]], list[VerifierScore]]
"""What ranks a split's sampled answers (a verifier: ``verifying.Verifying.scorer``)."""


class Stages(StageBase):
    """The stages, in the order of Algorithm 1 (``loop.run_star``)."""

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
        prefix = self.prompt_for(self.kind)
        prompts = [prefix + self.context_for(ex) for ex, _ in items]
        rows = self._sampled("generate", n, model, items, prompts, spec,
                             lambda i: (self._stored_prompt(self.context_for(items[i][0]), self.kind), ()))
        self.timed("generate", t0)
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
        prefix = self.prompt_for(self.hint_kind)
        hint = self.exp.hint
        assert hint is not None  # rationalization has its hint formatter (experiment.build)
        with self.exp.calling(hint, "context"):
            hinted = [hint.context(self.task, ex) for ex, _ in items]

        def stored(i: int) -> tuple[str, Sequence[str]]:
            """Stored as if no hint had been given, unless p_show_hint_save says otherwise; the
            strings that would leak the answer (``hint_leak``)."""
            ex, s = items[i]
            show = coin(r.p_show_hint_save, self.seed, n, ex.id, s, "show_hint")
            prompt = (self._stored_prompt(hinted[i], self.hint_kind) if show
                      else self._stored_prompt(self.context_for(ex), self.kind))
            with self.exp.calling(hint, "leak_strings"):
                return prompt, hint.leak_strings(self.task, ex)

        rows = self._sampled("rationalize", n, model, items, [prefix + h for h in hinted], spec, stored)
        self.timed("rationalize", t0)
        return self._finish(rel, rows, Rationale, f"{it_dir(n)}/rationalize", UNSELECTED)

    def _sampled(self, stage: str, n: int, model: str, items: Sequence[tuple[Example, int]], prompts: Sequence[str],
                 spec: GenSpec | None, stored: Callable[[int], tuple[str, Sequence[str]]]) -> list[Rationale]:
        """What generation and rationalization share: ``prompts`` (one per (question, sample) of
        ``items``) sampled with seeds derived for ``stage``, truncation counted, judged (each
        question's samples at once: a group reward), and the rows, ``stored(i)`` giving row i's
        stored prompt and leak strings."""
        seeds = [derive_seed(self.seed, n, ex.id, s, stage) for ex, s in items]
        spec = spec or self.sample_spec
        cut = self.truncation.flags(prompts, spec, stage, n)
        chunks = self.generate_chunks(f"{it_dir(n)}/{stage}", prompts, seeds, spec, model, f"iter {n}: {stage}")
        texts = [c.text for c in chunks]
        mid = self.checkpoint_id(model)
        judged = self.judge_all(items, texts, stage, n)
        rows = []
        for i, ((ex, s), text, full, seed, c, j) in enumerate(zip(items, texts, prompts, seeds, cut, judged)):
            prompt, leaks = stored(i)
            rows.append(self._row(n, ex, s, text, prompt, full, seed, stage == "rationalize", mid, c, leaks,
                                  judged=j, chunk=chunks[i]))
        self.judge.flush(stage, n)
        return rows

    # -- before 3: the questions a filter declines (not rationalized, none of them kept) -
    def undeclined(self, n: int, wrong: Sequence[Example], generated: Sequence[Rationale]) -> list[Example]:
        """The ``wrong`` questions to rationalize: those no filter declines (``declined``), judged on
        the iteration's hint-free samples ``generated``."""
        out = self.declined(n, generated)
        return [x for x in wrong if x.id not in out]

    def declined(self, n: int, generated: Sequence[Rationale], history: Sequence[Candidate] | None = None
                 ) -> dict[str, str]:
        """The questions that the filters with ``decline`` (``capabilities.DeclinesQuestions``) take out
        of iteration ``n``, judged on its hint-free samples ``generated`` (``history``: what earlier
        iterations kept): question id -> the first such filter, in ``task.filters`` order. Asked
        before rationalization and again at selection (``select``), with the same samples and
        history: a deterministic filter answers alike, so nothing more is stored to resume."""
        flts = [(name, f) for name, f in self.exp.filters if isinstance(f, DeclinesQuestions)]
        if not flts:
            return {}
        if history is None:
            history = [r.candidate() for r in self.history(n)]
        candidates = [r.candidate() for r in generated if not r.was_hinted]
        ids = {c.question_id for c in candidates}
        out: dict[str, str] = {}
        for name, flt in flts:
            with self.exp.calling(flt, "decline"):
                got = flt.decline(candidates, history)
            self.exp.registry.returned(
                flt, "decline", got, isinstance(got, (list, tuple, set, frozenset))
                and all(isinstance(q, str) and q in ids for q in got), "a collection of the samples' question ids")
            for q in sorted(got):
                out.setdefault(q, name)
        return out

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
        history = [r.candidate() for r in self.history(n)]
        out = self.declined(n, [r for r in rows if not r.was_hinted], history)  # before the checker: all rejected
        rows = [replace(r, kept=False, rejected_by=out[r.question_id]) if r.question_id in out
                else replace(r, kept=r.correct, rejected_by=None if r.correct else "checker") for r in rows]
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
            method = "keep_among" if isinstance(flt, SeesRejected) else "keep"
            flags = self.exp.registry.returned(
                flt, method, flags, hasattr(flags, "__len__") and len(flags) == len(alive),
                f"one flag per candidate ({len(alive)})")
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
            ctx = self._stored_prompt(self.context_for(ex), self.kind)
            with self.exp.calling(self.task, "gold_completion"):
                completion = self.task.gold_completion(ex, direct)
            rows.append(rationale_of(n, ex, 0, ctx, completion, Verdict(ex.answer, True),
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
                    self.loading(init), \
                    self.exp.calling(self.backend, job[0]):
                res = job[1](self.store.root / model_rel, advance)
            self.store.record_checkpoint(model_rel, res.checkpoint_id)
            info = {"checkpoint": model_rel, "checkpoint_id": res.checkpoint_id, "steps": res.steps,
                    "tokens": res.tokens, "losses": list(res.losses), "examples": count}
        info["seconds"] = time.perf_counter() - t0
        info["trained_on"] = trained_on
        self.store.write_json(rel, info)
        self.timed("train", t0)
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
        prefix = "" if (self.cfg.evaluation.no_prompt and n > 0) else self.prompt_for(self.kind)
        items = [(ex, s) for ex in examples for s in range(k or 1)]
        contexts = [self.context_for(ex) for ex, _ in items]  # stored as the question (Evaluation.question)
        prompts = [prefix + q for q in contexts]
        seeds = [derive_seed(self.seed, n, ex.id, split, s, "evaluate_sample") if k else
                 derive_seed(self.seed, n, ex.id, split, "evaluate") for ex, s in items]
        what = f"evaluate {split}{' (sampled)' if k else ''}"
        cut = self.truncation.flags(prompts, spec, what, n)
        chunks = self.generate_chunks(f"{it_dir(n)}/{name}", prompts, seeds, spec, model, f"iter {n}: {what}")
        mid = self.checkpoint_id(model)
        rows = []
        stage = "evaluate_sampled" if k else "evaluate"
        judged = self.judge_all(items, [ch.text for ch in chunks], stage, n, split)
        for (ex, s), (text, extracted, v), full, c, q, ch in zip(items, judged, prompts, cut, contexts, chunks):
            where = self.where(n, ex, s, stage, split)
            rows.append(Evaluation(question_id=ex.id, cls=ex.cls, iteration=n, sample=s if k else None, split=split,
                                   generation=text, predicted=v.predicted, gold=ex.answer, correct=bool(v.correct),
                                   checker=self.exp.checker_name, model_checkpoint=mid, prompt_hash=prompt_hash(full),
                                   verdicts=self.judge.others(split, ex, text, extracted, v, where),
                                   prompt_truncated=c, question=q, model_version=ch.model_version,
                                   sampled_by=ch.sampled_by))
        self.judge.flush("evaluate_sampled" if k else "evaluate", n, split)
        self.timed("evaluate", t0)
        return self._finish(rel, rows, Evaluation, f"{it_dir(n)}/{name}", () if k else GREEDY)

    def evaluate_all(self, n: int, model: str, score: Scorer | None = None) -> Evaluated:
        """Every evaluation split, greedy, and sampled when ``evaluation.samples_per_question`` > 1
        or a verifier ranks the samples (``score(split, samples)``: its scores of them)."""
        splits = self.cfg.evaluation.splits
        greedy = {s: self.evaluate(n, model, s) for s in splits}
        if self.cfg.evaluation.samples_per_question <= 1 and score is None:
            return Evaluated(greedy)
        sampled = {s: self.evaluate_sampled(n, model, s) for s in splits}
        scores = {s: score(s, sampled[s]) for s in splits} if score is not None else {}
        return Evaluated(greedy, sampled, scores)
