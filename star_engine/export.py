"""``star-engine export RUN_DIR --pairs``: (question, correct rationale, wrong rationale) triples.

Every candidate rationale stays in ``iterations/NNN/rationales.parquet`` with its verdict
(``correct``, ``predicted``, ``kept``, ``rejected_by``); this pairs, per question over the whole
run, each kept rationale with each wrong one (the checker said no), for training a verifier
(V-STaR) or a preference model (DPO). One JSON object per line (``PAIR_FIELDS``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import IntegrityError, UserError
from .fsio import sha256_file
from .records import Rationale, read
from .store import atomic_write_bytes, read_manifest

PAIR_FIELDS = ("question_id", "class", "prompt", "gold", "chosen", "rejected", "chosen_iteration",
               "chosen_sample", "chosen_hinted", "rejected_iteration", "rejected_sample", "rejected_hinted",
               "rejected_predicted")
MAX_ROWS = 50_000_000  # rationales per file, as its footer declares them
_ITER = re.compile(r"^iterations/(\d{3,})/rationales\.parquet$")


def _rationale_files(root: Path) -> list[str]:
    """The run's intact rationales.parquet files (as the manifest records them), in iteration order."""
    manifest = read_manifest(root)
    if manifest is None:
        raise UserError(f"{root}: no manifest.json (not a run directory)")
    rels = sorted((r for r in manifest["artifacts"] if _ITER.match(r)), key=lambda r: int(_ITER.match(r).group(1)))
    for rel in rels:
        rec, path = manifest["artifacts"][rel], root / rel
        if not path.is_file() or path.stat().st_size != rec["bytes"] or sha256_file(path) != rec["sha256"]:
            raise IntegrityError(f"{path}: does not match its checksum in manifest.json (damaged or changed); "
                                 f"rerun the experiment to redo it")
    return rels


def _rows(path: Path) -> list[Rationale]:
    try:
        if pq.ParquetFile(path).metadata.num_rows > MAX_ROWS:
            raise IntegrityError(f"{path}: more than {MAX_ROWS} rows")
        return read(pq.read_table(path), Rationale, str(path))
    except (pa.ArrowException, OSError, TypeError) as e:
        raise IntegrityError(f"{path}: unreadable rationales file ({e})") from None


def pairs(root: Path, max_per_question: int = 0) -> Iterator[dict[str, Any]]:
    """Per question (in order of first appearance): every kept rationale (chosen) against every
    wrong one (rejected), both stored with the same prompt (the hint-free context unless
    ``p_show_hint_save`` stored a hinted one, which pairs only with its like), each text once;
    at most ``max_per_question`` pairs per question (0: all), the earliest first."""
    by_q: dict[str, list[Rationale]] = {}
    for rel in _rationale_files(root):
        for r in _rows(root / rel):
            if r.checker != "gold":  # gold completions are not the model's
                by_q.setdefault(r.question_id, []).append(r)
    for rows in by_q.values():
        rows.sort(key=lambda r: (r.iteration, r.was_hinted, r.sample))
        chosen = _unique(r for r in rows if r.kept)
        rejected = _unique(r for r in rows if not r.correct)
        out = 0
        for c in chosen:
            for w in rejected:
                if c.prompt != w.prompt or (max_per_question and out >= max_per_question):
                    continue
                out += 1
                yield {"question_id": c.question_id, "class": c.cls, "prompt": c.prompt, "gold": c.gold,
                       "chosen": c.rationale, "rejected": w.rationale, "chosen_iteration": c.iteration,
                       "chosen_sample": c.sample, "chosen_hinted": c.was_hinted,
                       "rejected_iteration": w.iteration, "rejected_sample": w.sample,
                       "rejected_hinted": w.was_hinted, "rejected_predicted": w.predicted}


def _unique(rows: Any) -> list[Rationale]:
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows:
        if (r.prompt, r.rationale) not in seen:
            seen.add((r.prompt, r.rationale))
            out.append(r)
    return out


def export_pairs(root: Path, out: Path, max_per_question: int = 0) -> int:
    """Write the pairs of run ``root`` to ``out`` (JSON Lines, atomically); returns how many."""
    if max_per_question < 0:
        raise UserError("--max-pairs-per-question: must be >= 0")
    lines = [json.dumps(p, ensure_ascii=False) for p in pairs(root, max_per_question)]
    if out.exists() and not out.is_file():
        raise UserError(f"{out}: exists and is not a file")
    atomic_write_bytes(out, ("\n".join(lines) + "\n" if lines else "").encode())
    return len(lines)
