"""The group filter of RAFT++ / Reinforce-Rej (Xiong et al. 2025): a question whose samples are
all right (or all wrong) carries no signal that tells its samples apart; the released code
gives such groups no weight. Most of GRPO's advantage over rejection sampling came from this.

In STaR a question whose hint-free samples are all wrong contributes none of them already (the
checker rejects wrong samples; its rationalized samples are kept, as rationalization still
applies): that half of the rule is STaR's own, counted in ``metrics.parquet``'s
``groups_all_wrong``. This filter adds the other half: it drops every sample of a question whose
hint-free samples (at least ``min_samples`` of them) were all right, counted in the ``rejected``
column (questions and examples)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from star_engine import Candidate, PosInt


class GroupFilter:
    """Drops the samples of the questions whose ``min_samples`` or more hint-free samples (this
    iteration's) were all right; a question with fewer samples is left alone (with one sample per
    question every right one would go)."""

    def __init__(self, *, min_samples: PosInt = 2):
        self.min_samples = int(min_samples)

    def keep(self, candidates: Sequence[Candidate], history: Sequence[Candidate]) -> list[bool]:
        """Without the rejected samples a group cannot be judged: the core calls ``keep_among``."""
        return self.keep_among(candidates, (), history)

    def keep_among(self, candidates: Sequence[Candidate], others: Sequence[Candidate],
                   history: Sequence[Candidate]) -> list[bool]:
        verdicts: dict[str, list[bool]] = defaultdict(list)
        for c in (*candidates, *others):
            if not c.was_hinted:
                verdicts[c.question_id].append(c.correct)
        saturated = {q for q, v in verdicts.items() if len(v) >= self.min_samples and all(v)}
        return [c.question_id not in saturated for c in candidates]
