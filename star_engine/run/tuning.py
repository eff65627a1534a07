"""Sampling tuners in the loop (``generation.tuner``; B-STaR, Zeng et al. 2025): before an
iteration generates, its tuner probes the iteration's model at a few temperatures on some of
the drawn questions and chooses the temperature the iteration samples at.

The probes are generated in stored chunks like every stage (``iterations/NNN/tune/``, dropped
once the choice is stored) and judged as the iteration's samples are (``task.reward`` when set);
the choice and every candidate's scores are stored in ``iterations/NNN/tuning.parquet`` (a
``chosen`` column marks the one used), which a resumed run reads back without asking again.
The probe (``CoreProbe``) also gives the questions' gold completions (``references``): B-STaR
counts each question's reference solution among its samples.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import TYPE_CHECKING
from collections.abc import Sequence

import pyarrow as pa

from ..api import Example, ProbeSample, TuningChoice
from ..jobs import GenSpec
from ..errors import PluginError, UserError
from ..seeds import derive_seed
from .stagebase import it_dir

if TYPE_CHECKING:
    from .stages import Stages


def tune(st: Stages, n: int, model: str, questions: Sequence[Example]) -> GenSpec | None:
    """The spec iteration ``n`` samples with when a tuner chooses its temperature (None: no
    tuner, ``[generation]``'s)."""
    tuner = st.exp.tuner
    if tuner is None:
        return None
    rel = f"{it_dir(n)}/tuning.parquet"
    if st.store.done(rel):
        chosen = [r["temperature"] for r in st.store.read_rows(rel) if r["chosen"]]
        return replace(st.sample_spec, temperature=chosen[0])
    name = st.cfg.generation.tuner["name"]
    probe = CoreProbe(st, n, model, questions, name)
    with st.exp.calling(tuner, "tune"):
        choice = tuner.tune(n, list(questions), probe, st.seed)
    rows = _rows(name, choice)
    names = sorted({k for r in rows for k in r} - {"chosen"})
    schema = pa.schema([(k, pa.float64()) for k in names] + [("chosen", pa.bool_())])
    st.store.write_table(rel, [{k: r.get(k) for k in schema.names} for r in rows], schema)
    st.drop_chunks(f"{it_dir(n)}/tune")
    return replace(st.sample_spec, temperature=choice.temperature)


class CoreProbe:
    """The ``Probe`` a tuner is given (a ``ReferenceProbe``): ``probe(temperature, ids, samples)``
    samples and judges (``_probe``); ``references(ids)`` gives the questions' gold completions.
    Asked for a question not drawn, twice, no sample or a negative temperature: the tuner's
    error."""

    def __init__(self, st: Stages, n: int, model: str, questions: Sequence[Example], name: str):
        self.st, self.n, self.model, self.name = st, n, model, name
        self.by_id = {ex.id: ex for ex in questions}

    def _asked(self, call: str, ids: Sequence[str], wrong: str = "") -> list[Example]:
        unknown = [i for i in ids if i not in self.by_id]
        wrong = ("questions not drawn: " + repr(unknown[:3]) if unknown else
                 "a question twice" if len(set(ids)) != len(ids) else wrong)
        if wrong:
            raise PluginError(f"tuner '{self.name}': {call} asks for {wrong}")
        return [self.by_id[i] for i in ids]

    def __call__(self, temperature: float, ids: Sequence[str], samples: int) -> list[list[ProbeSample]]:
        asked = self._asked(f"probe({temperature!r}, {len(ids)} ids, {samples!r})", ids,
                            "no sample or a negative temperature" if samples < 1 or not temperature >= 0 else "")
        least = self.st.judge.min_group("tune")  # a group reward judges each question's probes together
        if samples < least:
            raise UserError(f"generation.tuner: tuner '{self.name}' probes {samples} answers a question, and "
                            f"task.reward '{self.st.judge.name_for('tune')}' judges at least {least} of a question "
                            f"together; raise the tuner's samples", key="generation.tuner")
        return _probe(self.st, self.n, self.model, asked, float(temperature), int(samples))

    def references(self, ids: Sequence[str]) -> list[str]:
        """Each question's ``Task.gold_completion`` (``task.direct``'s kind), trimmed as a probe's
        answers are; the task's ``UserError`` when it has none."""
        st, out = self.st, []
        for ex in self._asked(f"references({len(ids)} ids)", ids):
            with st.exp.calling(st.task, "gold_completion"):
                completion = st.task.gold_completion(ex, st.cfg.task.direct)
            out.append(st.trim_text(completion))
        return out


def _rows(name: str, choice: TuningChoice) -> list[dict]:
    """The candidates' rows, the chosen one marked; a choice that is no temperature, or a
    candidate that is not a table of numbers, is the tuner's error."""
    t = choice.temperature
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise PluginError(f"tuner '{name}': chose temperature {t!r}, not a number >= 0")
    rows = []
    for c in choice.candidates:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in c.values()) or \
                "temperature" not in c:
            raise PluginError(f"tuner '{name}': a candidate must map names to numbers, with a temperature: {c!r}")
        rows.append({**{k: float(v) for k, v in c.items()}, "chosen": float(c["temperature"]) == float(t)})
    if not any(r["chosen"] for r in rows):
        rows.append({"temperature": float(t), "chosen": True})
    return rows


def _probe(st: Stages, n: int, model: str, questions: Sequence[Example], temperature: float,
           samples: int) -> list[list[ProbeSample]]:
    """``samples`` answers to each of ``questions`` at ``temperature`` (stored chunks keyed by the
    request, so a rerun finds them), judged as a training sample is (stage "tune")."""
    key = hashlib.sha256(repr((temperature, [q.id for q in questions], samples)).encode()).hexdigest()[:12]
    spec = replace(st.sample_spec, temperature=temperature)
    items = [(ex, s) for ex in questions for s in range(samples)]
    prefix = st.prompt_for(st.kind)
    prompts = [prefix + st.context_for(ex) for ex, _ in items]
    seeds = [derive_seed(st.seed, n, ex.id, s, "tune", temperature) for ex, s in items]
    texts = st.generate_texts(f"{it_dir(n)}/tune/{key}", prompts, seeds, spec, model,
                              f"iter {n}: tune t={temperature:g}")
    out: dict[str, list[ProbeSample]] = {ex.id: [] for ex in questions}
    for (ex, s), (trimmed, _, v) in zip(items, st.judge_all(items, texts, "tune", n)):
        score = None if v.score is None else float(v.score)
        out[ex.id].append(ProbeSample(ex.id, s, trimmed, v.predicted, bool(v.correct), score))
    st.judge.flush("tune", n)
    return [out[ex.id] for ex in questions]
