"""B-STaR's temperature tuning as its code was released (Zeng et al. 2025, "B-STaR: monitoring
and balancing exploration and exploitation in self-taught reasoners", ICLR 2025, arXiv:2412.17256,
Algorithm 1 and its balance score; code github.com/hkust-nlp/B-STaR at a0f5d95,
``train_code/determine_hyper.py`` and ``train_code/train_bstar.sh``).

Before each iteration the model answers ``samples`` times each of ``questions`` of the drawn
questions at each of ``temperatures``; each temperature is scored by the best balance score
over the reward thresholds τ in ``thresholds``, and the iteration samples at the temperature
of the best score (the first listed of equal ones: ``main``, ``effect_values.index(max(...))``).
For one temperature and one τ, as ``determine_hyper.py`` computes it:

1. Each question's solutions (``get_unique_trn_json``, lines 56-96): its answers with an
   extracted answer (the released code drops an output without its "# Answer" section; here an
   answer where the task's ``extract`` found none), each with its reward (the checker's graded
   ``ProbeSample.score`` when it gives one, else 1.0 right and 0.0 wrong: the released reward
   is a process reward model's score / 5 plus 1.0 for the reference's final answer, which
   without a process reward model is this 1/0), then the reference solution, appended with
   reward 1.0 (line 72; the task's gold completion, ``ReferenceProbe.references``). Ranked by
   reward, highest first, a stable sort (the reference after the answers it ties with; the
   released code shuffles its lines first, line 38: the probe's samples are independent
   draws, in no order of their own).
2. Selected: the first ``cap`` of those with reward > τ (line 82, strict), then deduplicated
   by (question, text) (lines 87-94: the cap counts repeats, the score does not).
3. ``cap`` (``find_rewardbase``, lines 139-153): the smallest of 1, 2, ... ``max_cap`` (64,
   its ``max_iterations``) with which the selection of all questions holds at least
   ``valid_sample_size`` (``--valid_sample_size``, 3550 in ``train_bstar.sh``) texts; else
   ``max_cap``.
4. Balance (``cal_modi_acc_soft``, lines 100-135), per question with a selected text: n' its
   distinct selected right ones (the reference's answer, line 121; here the checker's
   verdict), n its distinct selected ones; n'/n if n' >= ``target`` (8) else n' · (n'/n) /
   ``target``, i.e. min(n'/target, 1) · n'/n; averaged over those questions (np.mean).
5. τ (``find_strategy``, lines 157-176): from -1.0 by steps of 0.01 added up while <= 1.0 (200
   values, -1.0 ... 0.99); a temperature's score is its best balance, the first τ reaching it
   is recorded.

With a right/wrong checker every selected answer above τ = 0 is right, so there the score
reduces to min(n'/target, 1) with n' counting the reference; below τ = 0 the wrong ones are
selected too. The chosen τ only scores a temperature, as released (``train_bstar.sh`` takes
the temperature and sample count, line 150; the iteration's data are then kept by the
checker and the filters, as STaR keeps them); ``tuning.parquet`` records it with the cap.

Options beyond the released behaviour: ``preset`` (the sizes: "released" is
``train_bstar.sh``'s 15 temperatures 0.50-1.20, 64 samples, 1,000 queries,
``valid_sample_size`` 3550; "cpu" a small one), ``reference = false`` (no reference solution:
a departure, for a task without gold completions) and ``score = "share"`` (the score this
tuner gave before: min(u/target, 1) · u/r with u the distinct right texts and r the right
answers, no reference, cap nor threshold: a departure, not B-STaR as released)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from star_engine import (NON_EMPTY, Example, NonNegFloat, PosInt, Probe, ProbeSample, ReferenceProbe, TuningChoice,
                         UserError)
from star_engine.helpers import close_matches, uniform_subset

KEY = "generation.tuner"


def released_thresholds() -> tuple[float, ...]:
    """``find_strategy``'s τ: -1.0, then 0.01 added while the sum is <= 1.0 (floating-point
    sums, as there: 200 values, the last 0.9900000000000014)."""
    out, tau = [], -1.0
    while True:
        out.append(tau)
        tau += 0.01
        if tau > 1.0:
            return tuple(out)


@dataclass(frozen=True)
class Preset:
    """The sizes a ``preset`` names (options left unset take them)."""

    temperatures: tuple[float, ...]
    questions: int
    samples: int
    valid_sample_size: int


PRESETS = {
    # train_bstar.sh: temps=(0.50 ... 1.20) (line 106), sample_num=64 (line 37), the 1k-query dev
    # set (line 41), --valid_sample_size 3550 (line 146)
    "released": Preset((0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2),
                       questions=1000, samples=64, valid_sample_size=3550),
    # every other 0.1 of the released range; 32 questions x 8 answers (the target 8 reachable), 4 x 32 x 8
    # = 1,024 probes an iteration; the released 3.55 selected texts a query: 3.55 x 32 = 113.6 -> 114
    "cpu": Preset((0.5, 0.7, 0.9, 1.1), questions=32, samples=8, valid_sample_size=114),
}
SCORES = ("released", "share")


def reward(answer: ProbeSample) -> float:
    """The reward τ is compared with: the checker's graded score, else 1.0 right and 0.0 wrong."""
    return float(answer.correct) if answer.score is None else float(answer.score)


@dataclass(frozen=True)
class Ranked:
    """One question's solutions as ``get_unique_trn_json`` ranks them (step 1): ``texts``,
    ``rewards`` (highest first) and ``right``; ``distinct[L]``/``distinct_right[L]``: the distinct
    texts among the first L, and how many of them are right (a text's first occurrence judged)."""

    query: str
    texts: tuple[str, ...]
    rewards: tuple[float, ...]
    right: tuple[bool, ...]
    distinct: tuple[int, ...]
    distinct_right: tuple[int, ...]
    negated: tuple[float, ...]  # -reward, ascending: for bisect

    @classmethod
    def of(cls, query: str, answers: Sequence[ProbeSample], reference: str | None) -> Ranked:
        """``answers`` with an extracted answer, then ``reference`` (reward 1.0, right; None: none),
        ranked by reward, highest first, stably."""
        solutions = [(a.text, reward(a), a.correct) for a in answers if a.predicted is not None]
        if reference is not None:
            solutions.append((reference, 1.0, True))
        solutions.sort(key=lambda s: s[1], reverse=True)
        seen: set[str] = set()
        distinct, right = [0], [0]
        for text, _, ok in solutions:
            new = text not in seen
            seen.add(text)
            distinct.append(distinct[-1] + new)
            right.append(right[-1] + (new and ok))
        return cls(query, tuple(s[0] for s in solutions), tuple(s[1] for s in solutions),
                   tuple(s[2] for s in solutions), tuple(distinct), tuple(right), tuple(-s[1] for s in solutions))

    def passing(self, tau: float) -> int:
        """How many rewards are > ``tau`` (a prefix: they are ranked)."""
        return bisect_left(self.negated, -tau)


def _selected(group: Sequence[Ranked], passing: Sequence[int], cap: int) -> tuple[int, int]:
    """(distinct selected texts, distinct selected right ones) of the questions sharing one
    query text (one question but where two have the same text): each question's first
    min(cap, passing) solutions, deduplicated by (query, text) in that order."""
    if len(group) == 1:
        n = min(cap, passing[0])
        return group[0].distinct[n], group[0].distinct_right[n]
    seen: set[str] = set()
    right = 0
    for q, m in zip(group, passing):
        for text, ok in zip(q.texts[:min(cap, m)], q.right):
            right += text not in seen and ok
            seen.add(text)
    return len(seen), right


def _counts(members: Sequence[Sequence[Ranked]], passed: Sequence[Sequence[int]], cap: int) -> list[tuple[int, int]]:
    return [_selected(g, p, cap) for g, p in zip(members, passed)]


def released_balance(ranked: Sequence[Ranked], thresholds: Sequence[float], target: int,
                     valid_sample_size: int, max_cap: int) -> dict[str, float]:
    """One temperature's best balance score over ``thresholds`` (steps 2-5 of the module
    docstring), with the τ that first reached it, its cap, and the mean distinct selected
    (``selected``) and right selected (``selected_right``) texts per question scored there.
    No τ selecting anything: score -inf (``find_strategy``'s start), the rest NaN."""
    groups: dict[str, list[int]] = {}
    for i, q in enumerate(ranked):
        groups.setdefault(q.query, []).append(i)
    members = [[ranked[i] for i in g] for g in groups.values()]
    nan = math.nan
    best = {"score": -math.inf, "threshold": nan, "cap": nan, "selected": nan, "selected_right": nan}
    tried: set[tuple[int, ...]] = set()
    for tau in thresholds:
        passing = tuple(q.passing(tau) for q in ranked)
        if passing in tried:  # the same selection as a τ before: the same score, never above it
            continue
        tried.add(passing)
        passed = [[passing[i] for i in g] for g in groups.values()]
        cap = _cap(members, passed, valid_sample_size, max_cap)
        scored = [(d, r) for d, r in _counts(members, passed, cap) if d > 0]
        if not scored:  # np.mean of nothing is NaN, which never beats the best
            continue
        values = [(r / d) if r >= target else (r * (r / d)) / target for d, r in scored]
        score = math.fsum(values) / len(values)
        if score > best["score"]:
            best = {"score": score, "threshold": tau, "cap": float(cap),
                    "selected": math.fsum(d for d, _ in scored) / len(scored),
                    "selected_right": math.fsum(r for _, r in scored) / len(scored)}
    return best


def _cap(members: Sequence[Sequence[Ranked]], passed: Sequence[Sequence[int]], valid_sample_size: int,
         max_cap: int) -> int:
    """The smallest cap in 1..``max_cap`` whose selection of all questions holds at least
    ``valid_sample_size`` texts, else ``max_cap`` (``find_rewardbase``'s loop; the count grows
    with the cap, so a bisection finds the same one)."""

    def total(cap: int) -> int:
        return sum(d for d, _ in _counts(members, passed, cap))

    if total(max_cap) < valid_sample_size:
        return max_cap
    lo, hi = 1, max_cap
    while lo < hi:
        mid = (lo + hi) // 2
        if total(mid) >= valid_sample_size:
            hi = mid
        else:
            lo = mid + 1
    return lo


def share_score(answers: Sequence[ProbeSample], target: int, distinct: bool = True) -> float:
    """``score = "share"`` (not B-STaR as released): one question's min(u/target, 1) · u/r, r its
    right answers, u the distinct right texts among them (``distinct = false``: u = r); 0 with
    none right."""
    right = [a.text for a in answers if a.correct]
    if not right:
        return 0.0
    unique = len(set(right)) if distinct else len(right)
    return min(unique / target, 1.0) * unique / len(right)


def _choice(value: str, known: Sequence[str], option: str) -> str:
    if value not in known:
        raise UserError(f"{option}: must be one of {', '.join(map(repr, known))}, got {value!r}"
                        f"{close_matches(value, list(known))}", key=option)
    return value


class BalanceTuner:
    """``generation.tuner = "balance"``: B-STaR's tuner as released (module docstring). Options
    left unset take the ``preset``'s value; set ones override it."""

    def __init__(self, *, preset: str = "cpu",
                 temperatures: Annotated[list[NonNegFloat], NON_EMPTY] | None = None,
                 questions: PosInt | None = None, samples: PosInt | None = None,
                 valid_sample_size: PosInt | None = None, max_cap: PosInt = 64, target: PosInt = 8,
                 thresholds: Annotated[list[float], NON_EMPTY] | None = None, reference: bool = True,
                 score: str = "released", distinct: bool = True):
        p = PRESETS[_choice(preset, list(PRESETS), "preset")]
        self.preset, self.score = preset, _choice(score, SCORES, "score")
        if not distinct and score != "share":
            raise UserError("distinct: counts repeats in score = 'share' only; B-STaR's score (score = 'released') "
                            "counts distinct texts", key="distinct")
        self.temperatures = [float(t) for t in (p.temperatures if temperatures is None else temperatures)]
        self.questions = int(p.questions if questions is None else questions)
        self.samples = int(p.samples if samples is None else samples)
        self.valid_sample_size = int(p.valid_sample_size if valid_sample_size is None else valid_sample_size)
        self.max_cap, self.target, self.reference, self.distinct = int(max_cap), int(target), reference, distinct
        self.thresholds = released_thresholds() if thresholds is None else tuple(float(t) for t in thresholds)
        # the core checks before the run that the task writes them (star_engine.capabilities.NeedsReferences)
        self.needs_references = self.score == "released" and reference

    def tune(self, iteration: int, questions: Sequence[Example], probe: Probe, seed: int) -> TuningChoice:
        ids = uniform_subset(questions, self.questions, seed, iteration)
        query = {ex.id: ex.question for ex in questions}
        refs = self._references(probe, ids) if self.score == "released" else [None] * len(ids)
        rows = []
        for t in self.temperatures:
            groups = probe(t, ids, self.samples)
            row: dict[str, float] = {"temperature": t}
            if self.score == "share":
                row["score"] = math.fsum(share_score(g, self.target, self.distinct) for g in groups) / len(groups)
            else:
                ranked = [Ranked.of(query[q], g, ref) for q, g, ref in zip(ids, groups, refs)]
                row.update(released_balance(ranked, self.thresholds, self.target, self.valid_sample_size,
                                            self.max_cap))
            row["accuracy"] = math.fsum(sum(a.correct for a in g) / len(g) for g in groups) / len(groups)
            row["mean_reward"] = math.fsum(reward(a) for g in groups for a in g) / sum(len(g) for g in groups)
            row["distinct_correct"] = math.fsum(len({a.text for a in g if a.correct}) for g in groups) / len(groups)
            rows.append(row)
        best = max(rows, key=lambda r: r["score"])  # the first of equal scores
        return TuningChoice(best["temperature"], rows)

    def _references(self, probe: Probe, ids: Sequence[str]) -> list[str | None]:
        """Each question's reference solution (``reference = true``), from the core's probe."""
        if not self.reference:
            return [None] * len(ids)
        fix = f"; set {KEY}.reference = false to tune without it (a departure from B-STaR)"
        if not isinstance(probe, ReferenceProbe):
            raise UserError(f"{KEY}.reference: the probe gives no reference solutions (it is no "
                            f"star_engine.ReferenceProbe){fix}", key=f"{KEY}.reference")
        try:
            return list(probe.references(ids))
        except UserError as e:
            raise UserError(f"{KEY}.reference: B-STaR counts each question's reference solution (the task's gold "
                            f"completion) among its samples, and the task gives none: {e}{fix}",
                            key=f"{KEY}.reference") from None
