"""Preference pairs: a question's right rationales against its wrong ones, the data a verifier
learns from (V-STaR; ``[verifier]``) and what ``star-engine export --pairs`` writes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
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


def verifier_pairs(rows: Iterable[Rationale], gold: Mapping[str, tuple[str, str]] | None = None,
                   max_per_question: int = 0, rationalized: bool = False) -> Iterator[tuple[str, str, str]]:
    """V-STaR's preference pairs (Hosseini et al. 2024, §3: the verifier learns by DPO to prefer a
    correct solution of a question to an incorrect one) from D_VER: ``rows``, the labelled samples
    (``rationales.parquet`` rows of the iterations collected), and ``gold``, question id ->
    (prompt, the task's gold solution), the original training data D_SFT that Algorithm 1 puts
    in D_VER first. Yields (prompt, chosen, rejected) per question, in order of first appearance:
    every correct solution (the gold one first, then the samples the checker judged right) against
    every incorrect sample, both with the same prompt, each text once; at most
    ``max_per_question`` pairs per question (0: all), the earliest first (by iteration, sample).

    A sample's label is the checker's verdict (``correct``), whatever STaR's filters did with it.
    Rationalized samples (written with the answer as a hint) are left out unless ``rationalized``:
    V-STaR samples without hints; with them, a rationalized sample is a correct solution when it
    was kept (right, and no filter refused it: a leaked hint is no solution)."""
    gold = gold or {}
    by_q: dict[str, list[Rationale]] = {}
    for r in rows:
        if r.checker != "gold" and (rationalized or not r.was_hinted):
            by_q.setdefault(r.question_id, []).append(r)
    for q, group in by_q.items():
        group.sort(key=lambda r: (r.iteration, r.was_hinted, r.sample))
        right = [(r.prompt, r.rationale) for r in group if (r.kept if r.was_hinted else r.correct)]
        chosen = _once(([gold[q]] if q in gold else []) + right)
        rejected = _once([(r.prompt, r.rationale) for r in group if not r.correct])
        out = 0
        for prompt, c in chosen:
            for p, w in rejected:
                if p != prompt or c == w:
                    continue
                if max_per_question and out >= max_per_question:
                    break
                out += 1
                yield prompt, c, w


def _once(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys(items))
