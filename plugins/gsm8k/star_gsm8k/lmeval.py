"""lm-evaluation-harness's GSM8K scoring, as its task files define it: the checkers
``gsm8k_strict`` ("strict-match") and ``gsm8k_flexible`` ("flexible-extract").

From ``lm_eval/tasks/gsm8k/gsm8k.yaml`` (EleutherAI/lm-evaluation-harness, task version 3.0,
checked at commit 47f16bf6) and ``gsm8k-cot.yaml`` (``gsm8k_cot``):

- filter "strict-match": ``regex`` with ``regex_pattern: "#### (\\-?[0-9\\.\\,]+)"`` (``gsm8k_cot``:
  ``"The answer is (\\-?[0-9\\.\\,]+)."``), then ``take_first``;
- filter "flexible-extract": ``regex`` with ``group_select: -1`` and
  ``regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"``, then ``take_first``;
- metric ``exact_match`` with ``ignore_case: true``, ``ignore_punctuation: false`` and
  ``regexes_to_ignore: [",", "\\$", "(?s).*#### ", "\\.$"]``.

The ``regex`` filter (``lm_eval/filters/extraction.py``, ``RegexFilter``): ``re.findall`` over the
response; no match gives the fallback ``"[invalid]"``; else the match at ``group_select`` (0:
the first, -1: the last), and of a match with several groups (a tuple) the first non-empty
one, stripped. ``take_first`` keeps the first response of each question (one here). The metric
(``exact_match_hf_evaluate`` in ``lm_eval/api/metrics.py``): each of ``regexes_to_ignore`` removed
with ``re.sub``, in order, from the prediction and the reference alike, then both lower-cased
(``ignore_case``), then compared for equality. The reference is the data set's whole answer
field: ``"(?s).*#### "`` removes its rationale; a bare gold answer (the ``gsm8k`` task's
``Example.answer``) passes through the same rules unchanged but for separators (``1,080`` ->
``1080``).

Both rules replace the task's extraction (as the ``regex`` checker's does): they read the whole
generation and ignore ``extracted``. ``predicted`` is the filtered response as lm-eval logs it
(``"72."``: before ``regexes_to_ignore``), None for ``"[invalid]"`` (which is compared as
lm-eval compares it, and matches no GSM8K answer).
"""

from __future__ import annotations

import re
from typing import Literal

from star_engine import Verdict

Variant = Literal["gsm8k", "gsm8k_cot"]  # the lm-eval task files, the keys of STRICT
STRICT: dict[Variant, str] = {"gsm8k": r"#### (\-?[0-9\.\,]+)",  # gsm8k.yaml, filter "strict-match"
          "gsm8k_cot": r"The answer is (\-?[0-9\.\,]+)."}  # gsm8k-cot.yaml, filter "strict-match"
FLEXIBLE = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"  # both files, filter "flexible-extract" (group_select: -1)
REGEXES_TO_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")  # metric exact_match
FALLBACK = "[invalid]"  # RegexFilter's default fallback


def regex_filter(response: str, pattern: re.Pattern[str], group_select: int) -> str:
    """lm-eval's ``RegexFilter`` on one response: the selected match (the first non-empty group of
    a tuple match), stripped; ``"[invalid]"`` when nothing matches."""
    matches = pattern.findall(response)
    if not matches:
        return FALLBACK
    match = matches[group_select]
    if isinstance(match, tuple):
        match = [m for m in match if m][0]
    return match.strip()


def exact_match(prediction: str, reference: str, regexes_to_ignore: tuple[str, ...] = REGEXES_TO_IGNORE,
                ignore_case: bool = True) -> bool:
    """lm-eval's ``exact_match`` for one pair, as GSM8K configures it (``ignore_punctuation`` false)."""
    for r in regexes_to_ignore:
        prediction, reference = re.sub(r, "", prediction), re.sub(r, "", reference)
    if ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    return prediction == reference


class _LmEvalGSM8K:
    pattern: re.Pattern[str]
    group_select: int

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        found = regex_filter(generation, self.pattern, self.group_select)
        return Verdict(None if found == FALLBACK else found, exact_match(found, gold))


class StrictChecker(_LmEvalGSM8K):
    """``gsm8k_strict``: lm-eval's "strict-match" (the first ``#### <number>``). Option
    ``variant``: ``"gsm8k"`` (default, ``gsm8k.yaml``) or ``"gsm8k_cot"`` (``gsm8k-cot.yaml``:
    the first ``The answer is <number>`` followed by any character)."""

    def __init__(self, *, variant: Variant = "gsm8k") -> None:
        self.variant = variant
        self.pattern, self.group_select = re.compile(STRICT[variant]), 0


class FlexibleChecker(_LmEvalGSM8K):
    """``gsm8k_flexible``: lm-eval's "flexible-extract" (the last number in the generation)."""

    def __init__(self) -> None:
        self.pattern, self.group_select = re.compile(FLEXIBLE), -1
