"""Rows of ``metrics.parquet``: one per iteration × split × class (null where a value does not apply)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

import pyarrow as pa

from .api import Example

METRICS_SCHEMA = pa.schema([
    ("iteration", pa.int32()), ("split", pa.string()), ("class", pa.string()), ("accuracy", pa.float64()),
    ("n", pa.int64()), ("generated", pa.int64()), ("correct", pa.int64()), ("rationalized", pa.int64()),
    ("kept", pa.int64()), ("train_steps", pa.int64()), ("train_tokens", pa.int64()), ("train_loss", pa.float64()),
    ("wall_seconds", pa.float64()), ("coverage", pa.float64()),
])


def _classes(items: Iterable[Any], key: str) -> list[str]:
    return ["all", *sorted({getattr(i, key) if not isinstance(i, dict) else i[key] for i in items} - {"all"},
                           key=natural)]


def natural(s: str) -> tuple:
    """Sort key: numeric classes ("2" before "10") first, then the others."""
    return (0, int(s), "") if s.isdecimal() and len(s) < 100 else (1, 0, s)


def coverage(solved: set[str], train: Sequence[Example]) -> dict[str, float]:
    """Share of train questions (per class) solved without a hint at least once so far."""
    out: dict[str, float] = {}
    for c in _classes(train, "cls"):
        qs = [e.id for e in train if c == "all" or e.cls == c]
        out[c] = sum(q in solved for q in qs) / len(qs) if qs else 0.0
    return out


def iteration_rows(n: int, rationales: Sequence[dict], evals: dict[str, Sequence[dict]], train: dict[str, Any],
                   cover: dict[str, float], seconds: float) -> list[dict]:
    losses = train.get("losses") or []
    tail = losses[-max(1, len(losses) // 10):] if losses else []
    common = {"iteration": n, "train_steps": int(train.get("steps", 0)), "train_tokens": int(train.get("tokens", 0)),
              "train_loss": sum(tail) / len(tail) if tail else None, "wall_seconds": float(seconds)}
    rows: list[dict] = []
    if rationales:
        gen = [r for r in rationales if not r["was_hinted"]]
        hinted = [r for r in rationales if r["was_hinted"]]
        for c in _classes(rationales, "class"):
            g = [r for r in gen if c == "all" or r["class"] == c]
            h = [r for r in hinted if c == "all" or r["class"] == c]
            k = [r for r in rationales if r["kept"] and (c == "all" or r["class"] == c)]
            rows.append({**common, "split": "train", "class": c, "n": len({r["question_id"] for r in g}) or len(k),
                         "generated": len(g), "correct": sum(r["correct"] for r in g),
                         "accuracy": sum(r["correct"] for r in g) / len(g) if g else None,
                         "rationalized": sum(r["correct"] for r in h), "kept": len(k),
                         "coverage": cover.get(c, None)})
            if h:  # hinted generations are tallied under their own class, as in the original
                rows.append({**common, "split": "train", "class": f"{c}_r", "n": len(h), "generated": len(h),
                             "correct": sum(r["correct"] for r in h),
                             "accuracy": sum(r["correct"] for r in h) / len(h),
                             "rationalized": sum(r["correct"] for r in h),
                             "kept": sum(r["kept"] for r in h), "coverage": None})
    for split, ev in evals.items():
        for c in _classes(ev, "class"):
            e = [r for r in ev if c == "all" or r["class"] == c]
            rows.append({**common, "split": split, "class": c, "n": len(e), "generated": len(e),
                         "correct": sum(r["correct"] for r in e),
                         "accuracy": sum(r["correct"] for r in e) / len(e) if e else None,
                         "rationalized": 0, "kept": 0, "coverage": cover.get("all", None)})
    return rows


def dev_accuracy(rows: Sequence[dict], split: str) -> float | None:
    for r in rows:
        if r["split"] == split and r["class"] == "all":
            return r["accuracy"]
    return None


def group_by_iteration(rows: Sequence[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        out[r["iteration"]].append(r)
    return out
