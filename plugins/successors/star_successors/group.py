"""Reinforce-Rej's prompt filter (Xiong et al. 2025, "A Minimalist Approach to LLM Reasoning: from
Rejection Sampling to Reinforce", arXiv 2504.11343; abstract and introduction): a prompt whose
sampled responses are ALL WRONG or ALL RIGHT is dropped. The paper's main finding is that GRPO's
edge over plain Reinforce comes mostly from discarding the prompts whose responses are all wrong
(not from its reward normalization); Reinforce-Rej discards both kinds.

Released code (github.com/RLHFlow/Minimal-RL, ``verl/trainer/ppo/core_algos.py``,
``compute_reinforce_rej_outcome_advantage``; ``scripts/run_reinforce_rej.sh``, 4 responses a
prompt): a prompt's responses form a group (by ``uid``); each response's advantage is its reward
when the standard deviation of its group's rewards is above 0, else 0. A group of one response
is given a deviation of 1, so it is never dropped. With right/wrong rewards, "no deviation" is
"all right or all wrong". RAFT (``compute_raft_outcome_advantage``: rewards below 0 set to 0,
i.e. train on the positively rewarded responses only) and RAFT++ (RAFT with the policy loss's
importance ratio and clipping, ``policy_loss=plusplus``) have no such group rule: it is
Reinforce-Rej's alone.

Here a group is a question's hint-free samples of this iteration (``generation.samples_per_question``
answers to the same few-shot prompt); its rewards are the checker's verdicts. STaR trains on the
right samples only, as RAFT does, so the two halves act differently:

- all right: every right sample of the question is dropped at selection (``keep_among``);
- all wrong: none of its hint-free samples is trained on anyway, but STaR rationalizes the
  question and trains on its right rationalizations. STaR and Reinforce-Rej disagree on exactly
  these questions. By default (the paper's) the filter declines them before rationalization
  (``decline``): they are not rationalized, and their samples are recorded as rejected by it.

Options (each departure from the released code is named):

- ``drop``: the halves applied; both by default (Reinforce-Rej). ``["all_right"]`` alone is a
  departure that leaves STaR's rationalization of the all-wrong questions as it is;
  ``["all_wrong"]`` alone is a departure that keeps the all-right questions (GRPO's implicit
  half, by the paper's finding).
- ``min_samples`` (default 2, the released code's rule: a one-sample group is kept): a question
  with fewer hint-free samples is left alone. 1 (drop one-sample groups too) is a departure.
- ``rationalize_all_wrong`` (default false): a departure kept for the record: the all-wrong
  questions are rationalized all the same (``rationalized.parquet``, ``rationalized`` in
  ``metrics.parquet``: what STaR would have rescued), then their rationalized samples are
  dropped at selection. The training set is the default's; the hint generations are the cost.

Counts: ``metrics.parquet``'s ``groups_all_right`` and ``groups_all_wrong``, and ``rejected``
(``{filter, examples, questions}``): the samples of the questions this filter dropped, the
declined all-wrong questions' hint-free samples included (those rows carry ``rejected_by =
"group"`` though the checker judged them wrong). The released code keeps the zero-advantage
responses in the batch (they count in the policy loss's token mean); a fine-tuning set has no
advantage weight, so here they are left out of it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

from star_engine import NON_EMPTY, Candidate, PosInt, UserError

Half = Literal["all_wrong", "all_right"]


class GroupFilter:
    """Drops the questions whose ``min_samples`` or more hint-free samples (this iteration's)
    were all wrong or all right (``drop``): the all-wrong ones before rationalization unless
    ``rationalize_all_wrong``, the all-right ones at selection."""

    def __init__(self, *, drop: Annotated[tuple[Half, ...], NON_EMPTY] = ("all_wrong", "all_right"),
                 min_samples: PosInt = 2, rationalize_all_wrong: bool = False):
        self.drop = frozenset(drop)
        self.min_samples = int(min_samples)
        self.rationalize_all_wrong = bool(rationalize_all_wrong)
        if self.rationalize_all_wrong and "all_wrong" not in self.drop:
            raise UserError('rationalize_all_wrong: has no effect without "all_wrong" in drop (without it the '
                            "all-wrong questions are rationalized and trained on, as STaR does)")

    def groups(self, samples: Iterable[Candidate]) -> tuple[set[str], set[str]]:
        """(all right, all wrong): the questions among ``samples`` with ``min_samples`` or more
        hint-free samples, all right / all wrong (the halves not in ``drop`` left empty)."""
        verdicts: dict[str, list[bool]] = defaultdict(list)
        for c in samples:
            if not c.was_hinted:
                verdicts[c.question_id].append(c.correct)
        judged = {q: v for q, v in verdicts.items() if len(v) >= self.min_samples}
        right = {q for q, v in judged.items() if all(v)} if "all_right" in self.drop else set()
        wrong = {q for q, v in judged.items() if not any(v)} if "all_wrong" in self.drop else set()
        return right, wrong

    def decline(self, generated: Sequence[Candidate], history: Sequence[Candidate]) -> list[str]:
        """The all-wrong questions, taken out before rationalization (none unless ``"all_wrong"``
        is in ``drop``, nor with ``rationalize_all_wrong``)."""
        if self.rationalize_all_wrong:
            return []
        return sorted(self.groups(generated)[1])

    def keep(self, candidates: Sequence[Candidate], history: Sequence[Candidate]) -> list[bool]:
        """Without the rejected samples a group cannot be judged: the core calls ``keep_among``."""
        return self.keep_among(candidates, (), history)

    def keep_among(self, candidates: Sequence[Candidate], others: Sequence[Candidate],
                   history: Sequence[Candidate]) -> list[bool]:
        """False for every candidate of a dropped question: the right samples of an all-right one,
        the rationalized samples of an all-wrong one (``rationalize_all_wrong``)."""
        right, wrong = self.groups((*candidates, *others))
        return [c.question_id not in right | wrong for c in candidates]
