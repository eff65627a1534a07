"""V-STaR (Hosseini et al. 2024, "V-STaR: Training Verifiers for Self-Taught Reasoners",
Algorithm 1) in the loop. Its data D_VER starts from the original training data (the task's gold
solutions, ``verifier.gold``) and gathers the correct and incorrect samples of every iteration;
after the last iteration one verifier is trained on it by DPO, from G_SFT (the generator
fine-tuned on the original data: here M0, the base model after ``[base_training]``), which is
also DPO's frozen reference; it ranks the final generator's sampled answers (verifier@k). That is
``schedule = "final"`` with ``init = "base"`` (the defaults). ``schedule = "cumulative"`` trains
one at each evaluating iteration t on D_VER up to t (the paper's per-iteration curves);
``"each_iteration"`` on iteration n's samples alone (this project's earlier rule, a departure).
Pairs: ``preferences.verifier_pairs``.

Both steps are stages (``Stages.trained``; a stored score file): a resumed run returns what is
stored, and the verifier is a checkpoint of the run like the others (recorded with its hash in
the run's manifest; ``iterations/NNN/verifier/model``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Sequence

import structlog

from .. import ui
from ..api import PreferencePair, Progress, TrainExample, TrainResult
from ..capabilities import TrainsVerifiers
from ..errors import UserError
from ..rundir.preferences import verifier_pairs
from ..rundir.records import Evaluation, Rationale, VerifierScore
from ..seeds import derive_seed
from .stagebase import it_dir

from .stages import Scorer, Stages

if TYPE_CHECKING:
    from ..config.load import Config

log = structlog.get_logger("star_engine")


@dataclass(frozen=True)
class Verifying:
    """An iteration's verifier (``checkpoint``), the frozen reference it started from, and what
    ranks answers (``verifier.score``: "reward", DPO's implicit reward; "likelihood")."""

    checkpoint: str
    reference: str
    mode: str

    def scorer(self, st: Stages, n: int) -> Scorer:
        """What ranks iteration ``n``'s sampled answers of a split (``Stages.evaluate_all``)."""
        return lambda split, samples: self.score(st, n, split, samples)

    def score(self, st: Stages, n: int, split: str, samples: Sequence[Evaluation]) -> list[VerifierScore]:
        """The verifier's scores of ``samples`` (the sampled evaluation of ``split``), each answer
        after the prompt it would be trained with (the stored, hint-free context)."""
        rel = f"{it_dir(n)}/verifier_{split}.parquet"
        if st.store.done(rel):
            return st.store.read_records(rel, VerifierScore)
        t0 = time.perf_counter()
        by_id = {ex.id: ex for ex in st.exp.splits[split]}
        examples = [TrainExample(st.stored_context(by_id[r.question_id]), r.generation) for r in samples]
        logp = _logps(st, self.checkpoint, examples, f"iter {n}: verifier scores {split}")
        ref = logp if self.reference == self.checkpoint else \
            _logps(st, self.reference, examples, f"iter {n}: reference scores {split}")
        vid, rid = st.checkpoint_id(self.checkpoint), st.checkpoint_id(self.reference)
        rows = [VerifierScore(question_id=r.question_id, cls=r.cls, iteration=n, sample=int(r.sample or 0), split=split,
                              score=lv - lr if self.mode == "reward" else lv, logp=lv, logp_reference=lr,
                              verifier_checkpoint=vid, reference_checkpoint=rid)
                for r, lv, lr in zip(samples, logp, ref)]
        st.store.write_records(rel, rows, VerifierScore)
        st.timed("verify", t0)
        return rows


def _logps(st: Stages, model: str, examples: Sequence[TrainExample], what: str) -> list[float]:
    backend = st.backend
    assert isinstance(backend, TrainsVerifiers)  # experiment.build refuses [verifier] otherwise
    with ui.progress(what, len(examples)) as advance, \
            st.loading(model), \
            st.exp.calling(backend, "score"):
        out = backend.score(st.path(model), examples, st.cfg.generation.batch_size, progress=advance)
    if len(out) != len(examples):
        raise RuntimeError(f"backend scored {len(out)} of {len(examples)} answers")
    return [float(x) for x in out]


def due(cfg: Config, n: int, evaluating: bool) -> bool:
    """Whether iteration ``n`` trains a verifier: the last one (``schedule = "final"``), else each
    iteration that evaluates (``evaluating``), since the verifier ranks the evaluation's samples."""
    v = cfg.verifier
    if not v.enabled:
        return False
    return n == cfg.experiment.iterations if v.schedule == "final" else evaluating


def train_verifier(st: Stages, n: int, generator: str, base: str) -> Verifying:
    """The verifier of iteration ``n``: DPO on the pairs of D_VER (iteration ``n``'s samples for
    ``schedule = "each_iteration"``, else those of iterations 1..n, with the gold solutions when
    ``verifier.gold``) from ``base`` (M0 = G_SFT) or ``generator`` (M_n) (``verifier.init``),
    recorded in ``iterations/NNN/verifier/train.json``."""
    v = st.cfg.verifier
    init = generator if v.init == "generator" else base
    first = n if v.schedule == "each_iteration" else 1
    rows = [r for m in range(first, n + 1) for r in _rationales(st, m)]
    gold = _gold(st, rows) if v.gold else {}
    pairs = [PreferencePair(p, c, w) for p, c, w in verifier_pairs(rows, gold, v.max_pairs_per_question,
                                                                    v.rationalized)]
    spec = v.preference_spec(v.steps, derive_seed(st.seed, n, "verifier"))
    backend = st.backend

    def train(out: Path, advance: Progress) -> TrainResult:
        assert isinstance(backend, TrainsVerifiers)  # experiment.build refuses [verifier] otherwise
        return backend.train_preferences(st.path(init), out, pairs, spec, progress=advance)

    checkpoint, _ = st.trained(f"{it_dir(n)}/verifier", init, spec.steps, len(pairs), "pairs",
                               ("train_preferences", train))
    return Verifying(checkpoint, init, v.score)


def _rationales(st: Stages, m: int) -> list[Rationale]:
    """Iteration ``m``'s labelled samples (its ``rationales.parquet``)."""
    rel = f"{it_dir(m)}/rationales.parquet"
    return st.store.read_records(rel, Rationale) if st.store.done(rel) else []


def _gold(st: Stages, rows: Sequence[Rationale]) -> dict[str, tuple[str, str]]:
    """D_SFT's part of D_VER that can pair: the task's gold solution (``Task.gold_completion``) of
    each training question with an incorrect sample, after its stored hint-free prompt; none when
    the task has no gold solutions (a question without a gold answer has none either)."""
    wrong = {r.question_id for r in rows if not r.correct}
    out: dict[str, tuple[str, str]] = {}
    for ex in st.exp.splits[st.cfg.task.train_split]:
        if ex.id not in wrong or not ex.answer:
            continue
        try:
            with st.exp.calling(st.task, "gold_completion"):
                completion = st.task.gold_completion(ex, st.cfg.task.direct)
        except UserError as e:  # the task has no gold solutions: D_VER is the samples alone
            log.info("verifier_without_gold", reason=str(e))
            return {}
        out[ex.id] = (st.stored_context(ex), completion)
    return out
