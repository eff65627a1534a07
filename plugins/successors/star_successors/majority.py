"""TTRL's majority-vote reward (Zuo et al. 2025, "TTRL: Test-Time Reinforcement Learning", arXiv
2504.16084, the majority-voting reward of its method section; released code PRIME-RL/TTRL,
``verl/verl/utils/reward_score/ttrl/ttt_metrics.py: test_time_train_metrics``, called per prompt
by ``verl/verl/workers/reward_manager/ttrl.py: TTRLRewardManager._compute_ttrl_reward``), the
reward SRT trains with too (Shafayat et al. 2025, "Can large reasoning models self-train?",
arXiv 2505.21444: r(y) = 1[answer(y) = y_majority]).

For each question, its k samples' answers (the task's extraction) vote; the answer given most
often is the pseudo-label, and a sample is right iff its answer is that same string. As the
released code: votes are counted on the extracted strings, a tie goes to the answer reached
first in sample order (``Counter.most_common``), the majority share is the winner's count over
all k samples. Where this departs from it (docs/successors.md):

- a sample matches the pseudo-label when its extracted answer is the same string (SRT's
  indicator); TTRL's code grades each answer against the pseudo-label with its math grader, so
  an equivalent form ("0.5" for "1/2") is rewarded there and not here;
- a sample with no answer (the task's extraction None) votes for nothing and is wrong; TTRL's
  extractor returns "" for it, which votes as an answer like any other;
- all k samples vote and all are judged (STaR keeps the right ones); TTRL votes with 64 and
  trains on the first 32;
- ``min_agreement`` is this project's option (neither paper has one): a question whose majority
  share is below it gets no pseudo-label, every sample of it wrong. 0 (the default): TTRL's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from star_engine import CheckContext, Fraction, Verdict


def pseudo_label(answers: Sequence[str | None]) -> tuple[str | None, float]:
    """(the majority answer of ``answers``, its share of all of them): the answer given most
    often, a tie to the one reached first; no answer (None) votes for nothing; (None, 0.0) when
    none has an answer."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None, 0.0
    label, count = votes.most_common(1)[0]  # equal counts: first seen first
    return label, count / len(answers)


class MajorityVote:
    """A checker that judges a question's samples together (``check_group``), for ``task.reward``:
    it reads no gold answer (``label_free``), so it trains on questions without one (test-time
    training: ``task.train_split``), and needs at least ``min_group`` samples a question
    (``generation.samples_per_question``; with 2 a vote is unanimity or a tie decided by order)."""

    min_group = 3
    label_free = True

    def __init__(self, *, min_agreement: Fraction = 0.0):
        self.min_agreement = float(min_agreement)

    def check_group(self, contexts: Sequence[CheckContext], generations: Sequence[str],
                    extracted: Sequence[str | None], gold: str) -> list[Verdict]:
        """One verdict per sample of one question: right iff its answer is the pseudo-label
        (``pseudo_label``), and the question has one (majority share >= ``min_agreement``).
        ``predicted``: the sample's own answer."""
        label, share = pseudo_label(extracted)
        labelled = label is not None and share >= self.min_agreement
        return [Verdict(a, labelled and a == label) for a in extracted]

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        """A generation judged alone is a group of one: its own majority (right when it has an
        answer, the share 1)."""
        return self.check_group([], [generation], [extracted], gold)[0]
