"""V-STaR (Hosseini et al. 2024) in the loop: after iteration n's fine-tuning, a verifier V_n is
trained by DPO on that iteration's preference pairs (``preferences.pair_up``: its kept rationales
against its wrong ones, at most ``verifier.max_pairs_per_question`` per question), starting from
the iteration's generator M_n (or the base model, ``verifier.init``), which stays frozen as
DPO's reference. The sampled evaluation's answers are then scored by V_n
(``verifier_<split>.parquet``) and ranked: verifier@k in ``metrics.parquet``.

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

from . import ui
from .api import PreferencePair, Progress, TrainExample, TrainResult
from .capabilities import TrainsVerifiers
from .preferences import pair_up
from .records import Evaluation, Rationale, VerifierScore
from .seeds import derive_seed
from .stagebase import it_dir

if TYPE_CHECKING:
    from .stages import Stages


@dataclass(frozen=True)
class Verifying:
    """An iteration's verifier (``checkpoint``), the frozen reference it started from, and what
    ranks answers (``verifier.score``: "reward", DPO's implicit reward; "likelihood")."""

    checkpoint: str
    reference: str
    mode: str

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
        st._timed("verify", t0)
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


def train_verifier(st: Stages, n: int, generator: str, base: str, rationales: Sequence[Rationale]) -> Verifying:
    """V_n: DPO on iteration ``n``'s pairs (of ``rationales``, its rows of ``rationales.parquet``)
    from ``generator`` (M_n) or ``base`` (``verifier.init``), recorded in
    ``iterations/NNN/verifier/train.json``."""
    v = st.cfg.verifier
    init = generator if v.init == "generator" else base
    pairs = [PreferencePair(c.prompt, c.rationale, w.rationale)
             for c, w in pair_up(rationales, v.max_pairs_per_question)]
    spec = v.preference_spec(v.steps, derive_seed(st.seed, n, "verifier"))
    backend = st.backend

    def train(out: Path, advance: Progress) -> TrainResult:
        assert isinstance(backend, TrainsVerifiers)  # experiment.build refuses [verifier] otherwise
        return backend.train_preferences(st.path(init), out, pairs, spec, progress=advance)

    checkpoint, _ = st.trained(f"{it_dir(n)}/verifier", init, spec.steps, len(pairs), "pairs",
                               ("train_preferences", train))
    return Verifying(checkpoint, init, v.score)
