"""B-STaR's temperature tuning (Zeng et al. 2025, "B-STaR: monitoring and balancing exploration
and exploitation in self-taught reasoners"; its released ``determine_hyper.py``): before each
iteration, sample ``samples`` answers to each of ``questions`` of the drawn questions at each
of ``temperatures``, and sample the iteration at the temperature with the best balance score

    balance(q) = min(n'_q / target, 1) * n'_q / n_q

averaged over the questions, where n_q is the number of answers the reward selects (the right
ones) and n'_q the number of distinct right ones (exploration: enough different right
answers, up to ``target``; exploitation: few repeats among those selected); 0 for a question
with none right. B-STaR also tunes a reward model's threshold; with an answer checker's
right/wrong verdict there is no threshold to tune. Ties go to the temperature listed first."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Annotated

from star_engine import NON_EMPTY, Example, NonNegFloat, PosInt, Probe, ProbeSample, TuningChoice, uniform_subset


def balance_score(answers: Sequence[ProbeSample], target: int, distinct: bool = True) -> float:
    """One question's balance score from its judged ``answers`` (``distinct``: count distinct
    right texts as n'; else every right one, and the score is min(n / target, 1))."""
    right = [a.text for a in answers if a.correct]
    if not right:
        return 0.0
    unique = len(set(right)) if distinct else len(right)
    return min(unique / target, 1.0) * unique / len(right)


class BalanceTuner:
    def __init__(self, *, temperatures: Annotated[list[NonNegFloat], NON_EMPTY] = (0.5, 0.7, 0.9, 1.1),
                 questions: PosInt = 32, samples: PosInt = 8, target: PosInt = 8, distinct: bool = True):
        self.temperatures = [float(t) for t in temperatures]
        self.questions, self.samples, self.target, self.distinct = int(questions), int(samples), int(target), distinct

    def tune(self, iteration: int, questions: Sequence[Example], probe: Probe, seed: int) -> TuningChoice:
        ids = uniform_subset(questions, self.questions, seed, iteration)
        rows = []
        for t in self.temperatures:
            groups = probe(t, ids, self.samples)
            scores = [balance_score(g, self.target, self.distinct) for g in groups]
            right = [sum(a.correct for a in g) / len(g) for g in groups]
            rows.append({"temperature": t, "score": statistics.fmean(scores), "accuracy": statistics.fmean(right),
                         "distinct_correct": statistics.fmean(len({a.text for a in g if a.correct}) for g in groups)})
        best = max(rows, key=lambda r: r["score"])  # the first of equal scores
        return TuningChoice(best["temperature"], rows)
