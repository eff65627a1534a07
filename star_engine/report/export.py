"""``star-engine export RUN_DIR``: a run's rationales for other trainers, as JSON Lines.

Every candidate rationale stays in ``iterations/NNN/rationales.parquet`` with its verdict
(``correct``, ``predicted``, ``kept``, ``rejected_by``).

- ``--pairs``: per question over the whole run, each kept rationale with each wrong one (the
  checker said no), for training a verifier (V-STaR) or a preference model (DPO). One JSON
  object per line (``PAIR_FIELDS``).
- ``--sft``: the kept rationales, the fine-tuning sets, as TRL's ``SFTTrainer`` reads them:
  ``{"prompt", "completion"}`` (its standard prompt-completion type; the loss is on the
  completion) or ``{"messages": [user, assistant]}`` (its conversational type, the chat template
  applied by the trainer). The prompt is the stored one, what the run fine-tuned on: the
  hint-free context, without the few-shot prefix unless ``task.few_shot_train`` stored it;
  ``few_shot`` adds the task's prefix (as generation saw it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import IntegrityError, UserError
from ..rundir.fsio import sha256_file
from ..rundir.preferences import pair_up, unique
from ..rundir.records import MAX_ROWS, Rationale, read  # MAX_ROWS: rationales per file, as its footer declares them
from ..config.registry import Registry
from ..seeds import coin
from ..rundir.fsio import atomic_write_bytes
from ..rundir.store import check_regular, read_json_file, read_manifest

SFT_FORMATS = ("prompt-completion", "messages")
PAIR_FIELDS = ("question_id", "class", "prompt", "gold", "chosen", "rejected", "chosen_iteration",
               "chosen_sample", "chosen_hinted", "rejected_iteration", "rejected_sample", "rejected_hinted",
               "rejected_predicted")
_ITER = re.compile(r"^iterations/(\d{3,})/rationales\.parquet$")


def _iteration(rel: str) -> int:
    """The iteration of a ``rationales.parquet`` (a path ``_ITER`` matches)."""
    m = _ITER.match(rel)
    assert m is not None
    return int(m.group(1))


def _rationale_files(root: Path) -> list[str]:
    """The run's intact rationales.parquet files (as the manifest records them), in iteration order."""
    manifest = read_manifest(root)
    if manifest is None:
        raise UserError(f"{root}: no manifest.json (not a run directory)")
    rels = sorted((r for r in manifest["artifacts"] if _ITER.match(r)), key=_iteration)
    for rel in rels:
        rec, path = manifest["artifacts"][rel], root / rel
        if not path.is_file() or path.stat().st_size != rec["bytes"] or sha256_file(path) != rec["sha256"]:
            raise IntegrityError(f"{path}: does not match its checksum in manifest.json (damaged or changed); "
                                 f"rerun the experiment to redo it")
    return rels


def _rows(path: Path) -> list[Rationale]:
    check_regular(path, "Parquet file")
    try:
        if pq.ParquetFile(path).metadata.num_rows > MAX_ROWS:
            raise IntegrityError(f"{path}: more than {MAX_ROWS} rows")
        return read(pq.read_table(path), Rationale, str(path))
    except (pa.ArrowException, OSError, TypeError) as e:
        raise IntegrityError(f"{path}: unreadable rationales file ({e})") from None


def pairs(root: Path, max_per_question: int = 0) -> Iterator[dict[str, Any]]:
    """Per question (in order of first appearance), over the whole run: every kept rationale
    (chosen) against every wrong one (rejected), as ``preferences.pair_up`` pairs them."""
    rows = (r for rel in _rationale_files(root) for r in _rows(root / rel))
    for c, w in pair_up(rows, max_per_question):
        yield {"question_id": c.question_id, "class": c.cls, "prompt": c.prompt, "gold": c.gold,
               "chosen": c.rationale, "rejected": w.rationale, "chosen_iteration": c.iteration,
               "chosen_sample": c.sample, "chosen_hinted": c.was_hinted,
               "rejected_iteration": w.iteration, "rejected_sample": w.sample,
               "rejected_hinted": w.was_hinted, "rejected_predicted": w.predicted}


def _write_lines(out: Path, objects: list[dict[str, Any]]) -> int:
    """``objects`` as JSON Lines at ``out``, atomically (an existing file is replaced)."""
    if out.exists() and not out.is_file():
        raise UserError(f"{out}: exists and is not a file")
    lines = [json.dumps(o, ensure_ascii=False) for o in objects]
    atomic_write_bytes(out, ("\n".join(lines) + "\n" if lines else "").encode())
    return len(lines)


def export_pairs(root: Path, out: Path, max_per_question: int = 0) -> tuple[int, str]:
    """Write the pairs of run ``root`` to ``out`` (JSON Lines, atomically); returns how many,
    and why there are none when there are none."""
    if max_per_question < 0:
        raise UserError("--max-pairs-per-question: must be >= 0")
    n = _write_lines(out, list(pairs(root, max_per_question)))
    return n, "" if n else _no_pairs(root)


def _no_pairs(root: Path) -> str:
    """Why run ``root`` has no pair: no iteration selected yet, no rationale of the model's, none
    kept, none wrong, or kept and wrong ones that no question shares under one prompt."""
    rels = _rationale_files(root)
    if not rels:
        return "no iteration has selected its rationales yet"
    done = [_iteration(r) for r in rels]
    where = f"iteration {done[0]}" if len(done) == 1 else f"iterations {done[0]}-{done[-1]}"
    rows = [r for rel in rels for r in _rows(root / rel) if r.checker != "gold"]
    kept, wrong = sum(r.kept for r in rows), sum(not r.correct for r in rows)
    need = "a pair is a kept and a wrong rationale of one question"
    if not rows:
        return f"{where} trained on the task's gold completions (training.source = \"gold\"): no rationale to pair"
    if not kept:
        return f"none of the {len(rows)} rationales of {where} was kept; {need}"
    if not wrong:
        return f"none of the {len(rows)} rationales of {where} was wrong; {need}"
    return (f"{kept} kept and {wrong} wrong rationales in {where}, but no question has both stored with the "
            f"same prompt")


# ----------------------------------------------------------------------------- --sft


def kept_rationales(root: Path, iteration: int | None = None) -> tuple[list[Rationale], str]:
    """The kept rows of iteration ``iteration``'s rationales (its fine-tuning set, in file order:
    every row the run trained on), or of every iteration (each distinct prompt and completion
    once, earliest first); and why there are none when there are none."""
    rels = _rationale_files(root)
    done = [_iteration(r) for r in rels]
    if iteration is not None:
        if iteration not in done:
            have = ", ".join(map(str, done)) or "none yet"
            raise UserError(f"--iteration {iteration}: {root} has no rationales for it (iterations selected: {have})")
        rels = [rel for rel, n in zip(rels, done) if n == iteration]
    rows = [r for rel in rels for r in _rows(root / rel)]
    kept = [r for r in rows if r.kept]
    if iteration is None:
        kept = unique(kept)
    if not rels:
        return [], "no iteration has selected its fine-tuning set yet"
    where = f"iteration {iteration}" if iteration is not None else f"iterations {done[0]}-{done[-1]}"
    return kept, "" if kept else f"none of the {len(rows)} rationales of {where} was kept"


def _prefixes(root: Path) -> tuple[Any, bool]:
    """(a function row -> the few-shot prefix its stored prompt goes with, whether the stored
    prompts already hold it), from the run's ``config.json`` and its task plugin."""
    cfg = read_json_file(root / "config.json", 64 << 20, "config.json")
    try:
        task_cfg, seed = cfg["task"], cfg["experiment"]["seed"]
        p_show = cfg.get("rationalization", {}).get("p_show_hint_save", 0.0)
        dataset, options = task_cfg["dataset"], task_cfg.get("options", {})
    except (KeyError, TypeError, AttributeError):
        raise UserError(f"{root / 'config.json'}: not a run's resolved configuration") from None
    if task_cfg.get("few_shot_train", False):
        return None, True
    registry = Registry()
    task = registry.create("task", dataset, options, "task.dataset", "task.options")
    # experiment.prompt_kinds: the kinds the run asked its task for, (plain, hinted)
    plain, hinted = ("direct", "direct_hint") if task_cfg.get("direct", False) else ("rationale", "hint")
    with registry.calling(task, "prompt"):
        cache = {kind: task.prompt(kind) for kind in (plain, hinted) if kind == plain or p_show > 0}

    def prefix(r: Rationale) -> str:
        # stages.rationalize: a hinted row's prompt is the hinted context when this coin fired
        shown = r.was_hinted and coin(p_show, seed, r.iteration, r.question_id, r.sample, "show_hint")
        return cache[hinted if shown else plain]

    return prefix, False


def sft_record(prompt: str, completion: str, fmt: str) -> dict[str, Any]:
    """One line of TRL's prompt-completion type, or of its conversational type (``messages``;
    the contents stripped: a chat template puts its own separators around them)."""
    if fmt == "messages":
        return {"messages": [{"role": "user", "content": prompt.strip()},
                             {"role": "assistant", "content": completion.strip()}]}
    return {"prompt": prompt, "completion": completion}


def export_sft(root: Path, out: Path, fmt: str = "prompt-completion", iteration: int | None = None,
               few_shot: bool = False) -> tuple[int, str]:
    """Write the kept rationales of run ``root`` to ``out`` in TRL's format ``fmt`` (JSON Lines,
    atomically); returns how many, and why there are none (or a note on ``few_shot``)."""
    if fmt not in SFT_FORMATS:
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(SFT_FORMATS)}")
    if iteration is not None and iteration < 1:
        raise UserError(f"--iteration: must be >= 1, got {iteration}")
    rows, why = kept_rationales(root, iteration)
    prefix, stored = _prefixes(root) if few_shot else (None, False)
    note = "the stored prompts already hold the few-shot prefix (task.few_shot_train = true)" if stored else ""
    lines = [sft_record((prefix(r) if prefix else "") + r.prompt, r.rationale, fmt) for r in rows]
    return _write_lines(out, lines), why or note
