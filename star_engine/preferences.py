"""Preference pairs: a question's right rationales against its wrong ones, the data a verifier
learns from (V-STaR; ``[verifier]``) and what ``star-engine export --pairs`` writes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from .records import Rationale


def pair_up(rows: Iterable[Rationale], max_per_question: int = 0) -> Iterator[tuple[Rationale, Rationale]]:
    """(chosen, rejected) per question, in order of first appearance: every kept rationale against
    every wrong one, both stored with the same prompt (the hint-free context unless
    ``p_show_hint_save`` stored a hinted one, which pairs only with its like), each text once;
    at most ``max_per_question`` pairs per question (0: all), the earliest first (by iteration,
    hint-free before hinted, sample). Gold completions are not the model's: never paired."""
    by_q: dict[str, list[Rationale]] = {}
    for r in rows:
        if r.checker != "gold":
            by_q.setdefault(r.question_id, []).append(r)
    for group in by_q.values():
        group.sort(key=lambda r: (r.iteration, r.was_hinted, r.sample))
        chosen = unique(r for r in group if r.kept)
        rejected = unique(r for r in group if not r.correct)
        out = 0
        for c in chosen:
            for w in rejected:
                if c.prompt != w.prompt or (max_per_question and out >= max_per_question):
                    continue
                out += 1
                yield c, w


def unique(rows: Iterable[Rationale]) -> list[Rationale]:
    """``rows`` less those whose (prompt, text) came before."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows:
        if (r.prompt, r.rationale) not in seen:
            seen.add((r.prompt, r.rationale))
            out.append(r)
    return out
