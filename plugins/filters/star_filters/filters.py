"""Rationale filters: ``keep(candidates, history) -> list[bool]``, deterministic.

Each class is a factory whose keyword-only ``__init__`` parameters declare the
filter's TOML options (checked by the registry before the filter is built).
``history`` holds the candidates earlier iterations kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from star_engine import Candidate, NonNegInt


class HintLeakFilter:
    """Reject a candidate whose rationale contains one of its ``leak_strings``.

    Leak strings are matched with surrounding whitespace stripped (so " (CORRECT)"
    also catches "(CORRECT)" at the start of a line); blank ones are ignored.
    ``case_sensitive = false`` (the default) compares case-folded text.
    """

    def __init__(self, *, case_sensitive: bool = False) -> None:
        self.case_sensitive = case_sensitive

    def _fold(self, text: str) -> str:
        return text if self.case_sensitive else text.casefold()

    def leaks(self, candidate: Candidate) -> bool:
        rationale = self._fold(candidate.rationale)
        return any(self._fold(leak.strip()) in rationale
                   for leak in candidate.leak_strings if leak.strip())

    def keep(self, candidates: Sequence[Candidate], history: Sequence[Candidate]) -> list[bool]:
        return [not self.leaks(c) for c in candidates]


class DedupFilter:
    """Reject a rationale already kept earlier in this iteration (or, with
    ``across_iterations``, in an earlier iteration's ``history``).

    ``scope = "question"`` compares rationales of the same question only;
    ``"global"`` compares across questions. With ``normalize_whitespace`` (default)
    rationales are compared with runs of whitespace turned into one space and the
    ends stripped. The first occurrence in a batch is kept.
    ``across_iterations`` is off by default: with ``restart_from_base`` each
    iteration trains the base model afresh, so a rationale kept before must be
    kept again or the new training set silently shrinks.
    """

    def __init__(self, *, scope: Literal["question", "global"] = "question", normalize_whitespace: bool = True,
                 across_iterations: bool = False) -> None:
        self.scope, self.normalize_whitespace, self.across_iterations = scope, normalize_whitespace, across_iterations

    def key(self, candidate: Candidate) -> tuple[str, str]:
        text = candidate.rationale
        if self.normalize_whitespace:
            text = " ".join(text.split())
        return (candidate.question_id if self.scope == "question" else "", text)

    def keep(self, candidates: Sequence[Candidate], history: Sequence[Candidate]) -> list[bool]:
        seen = {self.key(c) for c in history} if self.across_iterations else set()
        flags = []
        for candidate in candidates:
            key = self.key(candidate)
            flags.append(key not in seen)
            seen.add(key)
        return flags


class LengthCapFilter:
    """Reject a rationale longer than ``max_chars`` characters or ``max_lines`` lines.

    0 turns a limit off. Lines are counted with ``str.splitlines`` (a trailing
    newline does not start a new line).
    """

    def __init__(self, *, max_chars: NonNegInt = 2000, max_lines: NonNegInt = 0) -> None:
        self.max_chars, self.max_lines = max_chars, max_lines

    def fits(self, rationale: str) -> bool:
        if self.max_chars and len(rationale) > self.max_chars:
            return False
        return not (self.max_lines and len(rationale.splitlines()) > self.max_lines)

    def keep(self, candidates: Sequence[Candidate], history: Sequence[Candidate]) -> list[bool]:
        return [self.fits(c.rationale) for c in candidates]
