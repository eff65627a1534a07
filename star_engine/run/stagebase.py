"""What every stage of a STaR iteration stands on (``stages.Stages`` derives from it): the
run's references to checkpoints, the task's methods named after their plugin, timings,
generation in stored chunks, judging a generation and the where of it.

Generation is split into fixed chunks, each stored on its own, so a killed run loses at most
one chunk. Every random choice takes its seed from (experiment seed, iteration, question,
sample, purpose), never from batch position, so results do not depend on batching or on where
a run was interrupted.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from contextlib import AbstractContextManager
from typing import Any
from collections.abc import Sequence

import pyarrow.parquet as pq
import structlog

from .. import ui
from ..api import CheckContext, Example, Verdict
from ..capabilities import Trims
from .experiment import Experiment, prompt_kinds
from ..jobs import GenRequest, GenSpec
from ..rundir.ledger import LEDGER_SCHEMA, ledger_rows
from .questions import draw
from ..rundir.records import Chunk, Rationale
from ..rundir.store import RunStore, loading_checkpoint
from .tokens import Truncation, count_tokens
from .verdicts import Judge

log = structlog.get_logger("star_engine")


def prompt_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def it_dir(n: int) -> str:
    return f"iterations/{n:03d}"


class StageBase:
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
        # written since: every process decides alike (star_engine.rundir.procs).
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

    def loading(self, ref: str) -> AbstractContextManager[None]:
        """``store.loading_checkpoint`` of the checkpoint ``ref`` names (a damaged one in the run
        directory is named as such)."""
        return loading_checkpoint(Path(self.path(ref)), not Path(ref).is_absolute())

    def checkpoint_id(self, ref: str) -> str:
        return self._checkpoint_id(self.path(ref))

    def _checkpoint_id(self, path: str) -> str:
        with self.exp.calling(self.backend, "checkpoint_id"):
            return self.backend.checkpoint_id(path)

    # -- the task's methods, a failure named after its plugin ---------------------------
    def prompt_for(self, kind: str) -> str:
        with self.exp.calling(self.task, "prompt"):
            return self.task.prompt(kind)

    def context_for(self, ex: Example) -> str:
        with self.exp.calling(self.task, "context"):
            return self.task.context(ex)

    def trim_text(self, text: str) -> str:
        """The part of a generation that is checked and stored (the optional ``Task.trim``)."""
        if not isinstance(self.task, Trims):
            return text
        with self.exp.calling(self.task, "trim"):
            return self.task.trim(text)

    # -- timing --------------------------------------------------------------------
    def timed(self, name: str, start: float) -> None:
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
    def generate_texts(self, rel_dir: str, prompts: Sequence[str], seeds: Sequence[int], spec: GenSpec,
                       model: str, what: str) -> list[str]:
        """The texts of ``generate_chunks``."""
        return [c.text for c in self.generate_chunks(rel_dir, prompts, seeds, spec, model, what)]

    def generate_chunks(self, rel_dir: str, prompts: Sequence[str], seeds: Sequence[int], spec: GenSpec,
                        model: str, what: str) -> list[Chunk]:
        """One generation per prompt, sampled by the run's engine (``generation.engine``) or else
        the backend, stored ``chunk_size`` at a time under ``rel_dir`` (a stored chunk is read
        back, not sampled again), each with what produced it."""
        size = self.cfg.generation.chunk_size
        chunks: list[Chunk] = []
        with ui.progress(what, len(prompts)) as advance:
            for i, start in enumerate(range(0, len(prompts), size)):
                rel = f"{rel_dir}/chunk-{i:05d}.parquet"
                if not self.store.done(rel):
                    reqs = [GenRequest(p, s) for p, s in zip(prompts[start:start + size], seeds[start:start + size])]
                    out, version, by = self._sample(model, reqs, spec, advance)
                    self.store.write_records(rel, [Chunk(index=start + j, text=t, model_version=version, sampled_by=by)
                                                   for j, t in enumerate(out)], Chunk)
                else:
                    advance(min(size, len(prompts) - start))
                chunks.extend(self.store.read_records(rel, Chunk))
        return chunks

    def _sample(self, model: str, reqs: Sequence[GenRequest], spec: GenSpec, advance: Any) -> tuple[list[str], str, str]:
        """(texts, model version, sampled by) of one chunk: the engine's, or the backend's ("", "")."""
        engine = self.exp.engine
        origin: Any
        with self.loading(model):
            if engine is None:
                with self.exp.calling(self.backend, "generate"):
                    out = self.backend.generate(self.path(model), reqs, spec, progress=advance)
                origin, (version, by) = self.backend, ("", "")
            else:
                with self.exp.calling(engine, "generate"):
                    out = engine.generate(self.path(model), reqs, spec, progress=advance)
                with self.exp.calling(engine, "provenance"):
                    version, by = engine.provenance()
                origin = engine
        self.exp.registry.returned(
            origin, "generate", out, hasattr(out, "__len__") and len(out) == len(reqs) and all(
                isinstance(t, str) for t in out), f"one text per request ({len(reqs)})")
        served = self.store.manifest.get("served_models", {})
        if version and version not in served:  # the manifest names every version an engine served
            self.store.set_header(served_models={**served, str(version): {"checkpoint": model, "sampled_by": by}})
        return list(out), str(version), str(by)

    def _finish(self, rel: str, rows: list, kind: type, chunk_dir: str | None, omit: tuple[str, ...] = ()) -> list:
        self.store.write_records(rel, rows, kind, omit)
        if chunk_dir:
            self.drop_chunks(chunk_dir)
        return rows

    def _stored(self, rel: str, chunk_dir: str, kind: type) -> list:
        """A finished stage's rows; chunks left by a run killed just after the stage's
        file was written are dropped now (their rows are in that file)."""
        if (self.store.root / chunk_dir).exists():
            self.drop_chunks(chunk_dir)
        return self.store.read_records(rel, kind)

    def drop_chunks(self, chunk_dir: str) -> None:
        self.store.forget(chunk_dir + "/")  # the chunks are inside the stage's file
        self.store.remove(chunk_dir)

    # -- the train questions of an iteration ----------------------------------------
    def train_questions(self, n: int, ledger: Sequence[dict]) -> list[Example]:
        """The questions iteration ``n`` draws (``star_engine.run.questions``), in the split's order."""
        qs, sampler = self.exp.splits[self.cfg.task.train_split], self.cfg.generation.sampler
        k = min(self.cfg.generation.n_train_samples or len(qs), len(qs))
        return draw(qs, k, self.exp.sampler, sampler.get("name", ""), n, ledger, self.seed, self.exp.registry)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text: the backend's optional ``count_tokens``, else UTF-8 bytes."""
        return count_tokens(self.backend, texts, self.exp.registry)

    def ledger(self, n: int, questions: Sequence[Example], rationales: Sequence[Rationale],
               before: Sequence[dict]) -> list[dict]:
        """Iteration ``n``'s rows of the per-question ledger (``star_engine.rundir.ledger``)."""
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
        return self._stored_prompt(self.context_for(ex), self.kind)

    def _stored_prompt(self, context: str, kind: str) -> str:
        return (self.prompt_for(kind) + context) if self.cfg.task.few_shot_train else context

    def _answer(self, text: str) -> tuple[str, str | None]:
        """(the generation as the task keeps it, the task's extraction from it)."""
        text = self.trim_text(text)
        with self.exp.calling(self.task, "extract"):
            extracted = self.task.extract(text)
        self.exp.registry.returned(self.task, "extract", extracted, extracted is None or isinstance(extracted, str),
                                   "the answer (a str) or None")
        return text, extracted

    def _judge(self, text: str, gold: str, where: CheckContext) -> tuple[str, str | None, Verdict]:
        """(the generation as the task keeps it, the task's extraction, the verdict that decides:
        ``verdicts.Judge``'s, told ``where`` the generation comes from)."""
        text, extracted = self._answer(text)
        return text, extracted, self.judge(text, extracted, gold, where)

    def judge_all(self, items: Sequence[tuple[Example, int]], texts: Sequence[str], stage: str, n: int,
                  split: str | None = None) -> list[tuple[str, str | None, Verdict]]:
        """``_judge`` of each of ``texts`` (sample ``s`` of question ``ex`` of ``split``, default the
        training split, for each ``(ex, s)`` of ``items``, of ``stage``): all at once when what
        judges the stage has ``check_many``, a question's samples together when it judges groups
        (``verdicts.Judge.each``)."""
        answers = [self._answer(t) for t in texts]
        verdicts = self.judge.each([a[0] for a in answers], [a[1] for a in answers], [ex.answer for ex, _ in items],
                                   [self.where(n, ex, s, stage, split) for ex, s in items])
        return [(t, e, v) for (t, e), v in zip(answers, verdicts)]

    def where(self, n: int, ex: Example, s: int, stage: str, split: str | None = None) -> CheckContext:
        """Where sample ``s`` of ``ex`` comes from (``split`` None: the training split, ``task.train_split``)."""
        return CheckContext(self.seed, n, ex.id, s, stage, split or self.cfg.task.train_split)

    def _row(self, n: int, ex: Example, s: int, text: str, stored: str, full: str, seed: int, hinted: bool,
             model_id: str, cut: bool | None, leaks: Sequence[str] = (),
             judged: tuple[str, str | None, Verdict] | None = None, chunk: Chunk | None = None) -> Rationale:
        """Sample ``s`` of ``ex`` as a row (``judged``: its ``judge_all`` already, else judged here)."""
        stage = "rationalize" if hinted else "generate"
        text, _, verdict = judged or self._judge(text, ex.answer, self.where(n, ex, s, stage))
        return rationale_of(n, ex, s, stored, text, verdict, was_hinted=hinted, checker=self.judge.name_for(stage),
                          model_checkpoint=model_id, prompt_hash=prompt_hash(full), seed=seed,
                          leak_strings=tuple(leaks), prompt_truncated=cut,
                          model_version=chunk.model_version if chunk else "", sampled_by=chunk.sampled_by if chunk else "")


def rationale_of(n: int, ex: Example, s: int, prompt: str, text: str, verdict: Verdict, **rest: Any) -> Rationale:
    """Sample ``s`` of iteration ``n`` for question ``ex``: ``text`` stored with ``prompt``, judged ``verdict``."""
    return Rationale(question_id=ex.id, cls=ex.cls, iteration=n, sample=s, prompt=prompt, rationale=text,
                     predicted=verdict.predicted, gold=ex.answer, correct=bool(verdict.correct), **rest)
