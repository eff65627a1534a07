"""The random-reward control (Shao et al. 2025, "Spurious rewards"): a checker that calls an
answer right with probability ``p`` whatever it says. On some model families such a reward
moves accuracy almost as far as the true one, so a method's gain means little without this
control. Use it as ``task.reward`` (what judges the training samples), so that the evaluation
is still the task's checker's: ``--set task.reward=random_reward``."""

from __future__ import annotations

from star_engine import CheckContext, Fraction, NonNegInt, Verdict
from star_engine.helpers import derive_seed


class RandomReward:
    """Right with probability ``p``, by a coin seeded per (experiment seed, ``seed``, iteration,
    question, sample, stage): the same sample gets the same verdict in every rerun, whatever the
    batching or an interruption, and two samples' coins are independent. ``predicted`` is the
    task's extraction (what the answer says), recorded as it is."""

    def __init__(self, *, p: Fraction = 0.5, seed: NonNegInt = 0):
        self.p, self.seed = float(p), int(seed)

    def _coin(self, *parts: object) -> bool:
        return derive_seed("random_reward", self.seed, *parts) / 0x80000000 < self.p

    def check_in(self, context: CheckContext, generation: str, extracted: str | None, gold: str) -> Verdict:
        c = context
        return Verdict(extracted, self._coin(c.seed, c.iteration, c.split, c.question_id, c.sample, c.stage))

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        """Without a context (a caller outside a run): a coin of the text and the gold answer."""
        return Verdict(extracted, self._coin(generation, gold))
