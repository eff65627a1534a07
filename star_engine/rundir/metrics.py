"""Rows of ``metrics.parquet`` (``records.Metrics``): one per iteration × split × class (null where a value
does not apply), from an iteration's ``records.Rationale`` and ``records.Evaluation`` rows."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast
from collections.abc import Iterable, Mapping, Sequence

from ..api import Example
from .records import CheckerAccuracy, Evaluation, FilterCount, Metrics, Rationale, VerifierScore, row, schema

METRICS_SCHEMA = schema(Metrics)
SAMPLING_COLUMNS = ("pass_k", "pass_at_k", "pass_at_1", "majority", "distinct_correct", "kept_len_mean",
                    "kept_len_std")
LATER_COLUMNS = (*SAMPLING_COLUMNS, "checkers", "prompts_truncated", "trained_on", "first_sample", "verifier_at_k",
                 "temperature", "groups_all_right", "groups_all_wrong", "rejected",
                 "agreement")  # what earlier versions' files lack
Answer = Rationale | Evaluation  # what pass@k and the majority vote read


def _classes(items: Iterable[Example | Answer]) -> list[str]:
    return ["all", *sorted({i.cls for i in items} - {"all"}, key=natural)]


def _metrics(common: dict[str, Any], **columns: Any) -> dict:
    """A row of ``metrics.parquet``: ``common`` updated with ``columns`` (``records.Metrics``, its names)."""
    return row(Metrics(**{**common, **columns}))


def natural(s: str) -> tuple:
    """Sort key: numeric classes ("2" before "10") first, then the others."""
    return (0, int(s), "") if s.isdecimal() and len(s) < 100 else (1, 0, s)


def coverage(solved: set[str], train: Sequence[Example]) -> dict[str, float]:
    """Share of train questions (per class) solved without a hint at least once so far."""
    out: dict[str, float] = {}
    for c in _classes(train):
        qs = [e.id for e in train if c == "all" or e.cls == c]
        out[c] = sum(q in solved for q in qs) / len(qs) if qs else 0.0
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` are correct (Chen et
    al. 2021): the chance that ``k`` of the ``n``, drawn without replacement, hold a correct one,
    ``1 - C(n-c, k) / C(n, k)``, computed exactly."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def best_of_k(ranked: Sequence[bool], k: int) -> float:
    """The unbiased estimate of best-of-k from ``n`` ranked samples: the chance that, of ``k`` of
    them drawn without replacement, the best-ranked is right. ``ranked``: the samples'
    correctness, best-ranked first. The i-th is the best of a draw in C(n-i-1, k-1) of the C(n, k)
    draws, so best-of-k = sum_i C(n-i-1, k-1) ranked[i] / C(n, k), computed exactly; at k = 1 it
    is the share right (pass@1), at k = n the best-ranked's correctness."""
    n = len(ranked)
    if not 1 <= k <= n:
        raise ValueError(f"best-of-k needs 1 <= k <= n, got n={n}, k={k}")
    hits = sum(math.comb(n - i - 1, k - 1) for i, right in enumerate(ranked) if right)
    return float(Fraction(hits, math.comb(n, k)))


def verifier_at_k(samples: Sequence[Answer], scores: Sequence[VerifierScore], k: int) -> float | None:
    """verifier@k over the questions of ``samples``: the mean over questions of ``best_of_k``, the
    samples ranked by their verifier score (highest first; equal scores in sample order). None
    when ``scores`` holds none of them."""
    by_key = {(s.question_id, s.sample): s.score for s in scores}
    by_q: dict[str, list[tuple[float, int, bool]]] = defaultdict(list)
    for r in samples:
        score = by_key.get((r.question_id, cast(int, r.sample)))
        if score is not None:
            by_q[r.question_id].append((-score, cast(int, r.sample), bool(r.correct)))
    if not by_q:
        return None
    n = min(len(v) for v in by_q.values())
    return sum(best_of_k([c for _, _, c in sorted(v)], min(k, n)) for v in by_q.values()) / len(by_q)


def majority_correct(samples: Sequence[Answer]) -> bool:
    """Majority vote over one question's samples (``predicted``, ``correct``, ``sample``): the
    answer given most often (no answer does not vote; a tie goes to the answer reached first,
    in sample order) is right."""
    ordered = sorted(samples, key=lambda r: cast(int, r.sample))  # a sampled answer's sample is set
    votes = Counter(r.predicted for r in ordered if r.predicted is not None)
    if not votes:
        return False
    winner = votes.most_common(1)[0][0]  # Counter keeps first-seen order among equal counts
    return any(r.correct for r in ordered if r.predicted == winner)


def sampling_columns(samples: Sequence[Answer], k: int, scores: Sequence[VerifierScore] = ()) -> dict[str, Any]:
    """pass@k, pass@1 (both unbiased), majority-vote accuracy and the first sample's accuracy
    over the questions of ``samples`` (rows with ``question_id``, ``sample``, ``predicted``,
    ``correct``); with ``scores``, verifier@k too."""
    by_q: dict[str, list[Answer]] = defaultdict(list)
    for r in samples:
        by_q[r.question_id].append(r)
    if not by_q:
        return {}
    n = min(len(v) for v in by_q.values())
    k = min(k, n)
    counts = [(len(v), sum(bool(r.correct) for r in v)) for v in by_q.values()]
    return {"pass_k": k, "pass_at_k": sum(pass_at_k(m, c, k) for m, c in counts) / len(counts),
            "pass_at_1": sum(pass_at_k(m, c, 1) for m, c in counts) / len(counts),
            "majority": sum(majority_correct(v) for v in by_q.values()) / len(by_q),
            "first_sample": sum(min(v, key=lambda r: cast(int, r.sample)).correct for v in by_q.values()) / len(by_q),
            **({"verifier_at_k": verifier_at_k(samples, scores, k)} if scores else {})}


def exploration_columns(rationales: Sequence[Rationale], kept_lengths: Sequence[int]) -> dict[str, Any]:
    """Exploration (distinct correct hint-free rationales per solved question) and exploitation
    (mean and standard deviation of the kept set's lengths, ``kept_lengths`` in tokens)."""
    correct: dict[str, set[str]] = defaultdict(set)
    for r in rationales:
        if r.correct and not r.was_hinted:
            correct[r.question_id].add(r.rationale)
    return {"distinct_correct": sum(map(len, correct.values())) / len(correct) if correct else None,
            "kept_len_mean": statistics.fmean(kept_lengths) if kept_lengths else None,
            "kept_len_std": statistics.pstdev(kept_lengths) if kept_lengths else None}


@dataclass(frozen=True)
class Evaluated:
    """An iteration's evaluation: per split, the greedy answers, the sampled ones
    (``evaluation.samples_per_question`` > 1) and the verifier's scores of those (``[verifier]``)."""

    greedy: Mapping[str, Sequence[Evaluation]] = field(default_factory=dict)
    sampled: Mapping[str, Sequence[Evaluation]] = field(default_factory=dict)
    scores: Mapping[str, Sequence[VerifierScore]] = field(default_factory=dict)


def iteration_rows(n: int, rationales: Sequence[Rationale], evals: Evaluated, train: dict[str, Any],
                   cover: dict[str, float], seconds: float, pass_k: int = 1, lengths: Sequence[int] = ()) -> list[dict]:
    """One row per split and class. ``evals``: the evaluation (pass@k with ``pass_k``, majority
    vote, verifier@k); ``lengths``: the tokens of each of ``rationales``; ``train``: the
    fine-tuning stage's record (``train.json``), with the tuned ``temperature`` when a tuner chose it."""
    losses = train.get("losses") or []
    tail = losses[-max(1, len(losses) // 10):] if losses else []
    common = {"iteration": n, "train_steps": int(train.get("steps", 0)), "train_tokens": int(train.get("tokens", 0)),
              "train_loss": sum(tail) / len(tail) if tail else None, "wall_seconds": float(seconds),
              "trained_on": train.get("trained_on") if train.get("steps") else None}
    rows: list[dict] = []
    if rationales:
        gen = [r for r in rationales if not r.was_hinted]
        hinted = [r for r in rationales if r.was_hinted]
        for c in _classes(rationales):
            g = [r for r in gen if c == "all" or r.cls == c]
            h = [r for r in hinted if c == "all" or r.cls == c]
            k = [r for r in rationales if r.kept and (c == "all" or r.cls == c)]
            rows.append(_metrics(common, split="train", cls=c, n=len({r.question_id for r in g}) or len(k),
                                 generated=len(g), correct=sum(r.correct for r in g),
                                 accuracy=sum(r.correct for r in g) / len(g) if g else None,
                                 rationalized=sum(r.correct for r in h), kept=len(k), coverage=cover.get(c, None),
                                 prompts_truncated=truncated(g), temperature=train.get("temperature"),
                                 rejected=rejections([r for r in rationales if c == "all" or r.cls == c]),
                                 **groups(g), **_train_sampling(rationales, lengths, c)))
            if h:  # hinted generations are tallied under their own class, as in the original
                rows.append(_metrics(common, split="train", cls=f"{c}_r", n=len(h), generated=len(h),
                                     correct=sum(r.correct for r in h), accuracy=sum(r.correct for r in h) / len(h),
                                     rationalized=sum(r.correct for r in h), kept=sum(r.kept for r in h),
                                     coverage=None, prompts_truncated=truncated(h)))
    for split, ev in evals.greedy.items():
        sampled, scores = evals.sampled.get(split, ()), evals.scores.get(split, ())
        for c in _classes(ev):
            e = [r for r in ev if c == "all" or r.cls == c]
            rows.append(_metrics(common, split=split, cls=c, n=len(e), generated=len(e),
                                 correct=sum(r.correct for r in e),
                                 accuracy=sum(r.correct for r in e) / len(e) if e else None,
                                 rationalized=0, kept=0, coverage=cover.get("all", None), checkers=checker_columns(e),
                                 prompts_truncated=truncated(e),
                                 **sampling_columns([r for r in sampled if c == "all" or r.cls == c], pass_k, scores)))
    return rows


def groups(plain: Sequence[Rationale]) -> dict[str, int | None]:
    """The questions whose hint-free samples (``plain``) were all right, and all wrong: null with
    one sample per question (every question is one or the other)."""
    by_q: dict[str, list[bool]] = defaultdict(list)
    for r in plain:
        by_q[r.question_id].append(bool(r.correct))
    if not by_q or max(map(len, by_q.values())) < 2:
        return {}
    return {"groups_all_right": sum(all(v) for v in by_q.values()),
            "groups_all_wrong": sum(not any(v) for v in by_q.values())}


def agreement(plain: Sequence[Rationale]) -> float | None:
    """The mean over the questions of ``plain`` (hint-free samples) of the share of a question's
    samples whose answer (``predicted``) is its most common one (no answer agrees with none); null
    with one sample per question."""
    by_q: dict[str, list[str | None]] = defaultdict(list)
    for r in plain:
        by_q[r.question_id].append(r.predicted)
    if not by_q or max(map(len, by_q.values())) < 2:
        return None
    top = [max(Counter(a for a in v if a is not None).values(), default=0) / len(v) for v in by_q.values()]
    return sum(top) / len(top)


def rejections(rows: Sequence[Rationale]) -> tuple[FilterCount, ...]:
    """What each filter rejected among ``rows`` (the checker's rejections are not a filter's), in
    the order the filters first appear."""
    hits: dict[str, list[str]] = {}
    for r in rows:
        if r.rejected_by and r.rejected_by != "checker":
            hits.setdefault(r.rejected_by, []).append(r.question_id)
    return tuple(FilterCount(filter=name, examples=len(qs), questions=len(set(qs))) for name, qs in hits.items())


def truncated(rows: Sequence[Answer]) -> int | None:
    """How many of ``rows`` had their prompt left-truncated (None when none was counted)."""
    flags = [r.prompt_truncated for r in rows if r.prompt_truncated is not None]
    return sum(flags) if flags else None


def checker_columns(answers: Sequence[Evaluation]) -> tuple[CheckerAccuracy, ...]:
    """Each ``[evaluation] checkers`` entry's accuracy over ``answers`` (their ``verdicts``, in the
    entries' order): the answers it judged (a null verdict is an unjudged one), right, timed out."""
    tally: dict[str, list[int]] = {}  # label -> [judged, correct, timed out, skipped]
    for r in answers:
        for v in r.verdicts:
            t = tally.setdefault(v.checker, [0, 0, 0, 0])
            if v.correct is None:
                t[3] += 1
            else:
                t[0], t[1], t[2] = t[0] + 1, t[1] + v.correct, t[2] + v.timed_out
    return tuple(CheckerAccuracy(checker=label, accuracy=c / n if n else None, n=n, correct=c, timed_out=t,
                                 skipped=s) for label, (n, c, t, s) in tally.items())


def _train_sampling(rationales: Sequence[Rationale], lengths: Sequence[int], c: str) -> dict[str, Any]:
    """A train row's sampling and exploration columns, for class ``c``: pass@k over the
    hint-free rationales (k = their number per question: the share of questions with at least
    one correct), majority vote, distinct correct rationales, kept lengths."""
    padded: Sequence[int | None] = lengths or [None] * len(rationales)
    mine = [(r, t) for r, t in zip(rationales, padded)
            if c == "all" or r.cls == c]
    plain = [r for r, _ in mine if not r.was_hinted and r.checker != "gold"]
    k = max(Counter(r.question_id for r in plain).values(), default=0)
    kept = [t for r, t in mine if r.kept and t is not None]
    return {**(sampling_columns(plain, k) if plain else {}), **exploration_columns(plain, kept),
            "agreement": agreement(plain)}


def dev_accuracy(rows: Sequence[dict], split: str) -> float | None:
    for r in rows:
        if r["split"] == split and r["class"] == "all":
            return r["accuracy"]
    return None


# -- reading the rows back (the report's tables and plot) ---------------------------------

def eval_split(rows: Sequence[dict]) -> str:
    """The run's first evaluation split ("train" when it has none)."""
    splits = [r["split"] for r in rows if r["split"] != "train"]
    return splits[0] if splits else "train"


def series(rows: Sequence[dict], split: str, cls: str) -> tuple[list[int], list[float]]:
    """(iterations, accuracy in %) of ``split`` and class ``cls``."""
    pts = sorted((r["iteration"], r["accuracy"]) for r in rows if r["split"] == split and r["class"] == cls
                 and r["accuracy"] is not None)
    return [p[0] for p in pts], [100 * p[1] for p in pts]


def classes(rows: Sequence[dict], split: str) -> list[str]:
    """The eval split's classes other than "all", numbers in numeric order."""
    return sorted({r["class"] for r in rows if r["split"] == split and r["class"] != "all"}, key=natural)


def train_counts(rows: Sequence[dict]) -> list[tuple[int, int, int]]:
    """(iteration, kept, rationalized) of the fine-tuning set, per iteration."""
    return sorted((r["iteration"], r["kept"] or 0, r["rationalized"] or 0) for r in rows
                  if r["split"] == "train" and r["class"] == "all")


def has_exploration(rows: Sequence[dict]) -> bool:
    return any(r["pass_at_k"] is not None or r["kept_len_mean"] is not None for r in rows)


def train_all(rows: Sequence[dict]) -> list[dict]:
    """The train rows of class "all", by iteration."""
    return sorted((r for r in rows if r["split"] == "train" and r["class"] == "all"), key=lambda r: r["iteration"])


def nothing_kept_note(rows: Sequence[dict]) -> str | None:
    """The run summary's line for the iterations that kept nothing to train on (a ``nothing_kept``
    warning each; ``experiment.stop_when_nothing_kept`` ends the run at the first)."""
    its = sorted({r["iteration"] for r in rows if r["split"] == "train" and r["class"] == "all" and not r.get("kept")
                  and r.get("trained_on") in (None, "kept")})  # not gold, not the smoke fallback
    if not its:
        return None
    return (f"kept nothing to train on in iteration{'s' if len(its) > 1 else ''} {', '.join(map(str, its))}: "
            f"no sample was judged right (or every right one was filtered), so the model was not trained there")
