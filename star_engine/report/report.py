"""``star-engine report RUN_DIR [--compare OTHER]``: the Markdown summary (``report.md``) and
the plot (``report.png``, drawn by ``star_engine.report.plot``), and the summary the command prints.

Alone, the run is named by its experiment's name; with ``--compare`` each run is labelled by its
run directory (the trailing parts of the two paths that tell them apart: two runs of one
experiment file are told apart), or by ``--label``, and the report goes to
``report_vs_<other>.md`` / ``.png`` beside the run's own report, which stays as it is
(``--compare`` is deprecated: ``star-engine compare``, ``star_engine.report.compare``, compares any
number of runs outside their directories).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import IntegrityError, UserError
from ..rundir.fsio import in_the_way
from ..rundir.metrics import LATER_COLUMNS, METRICS_SCHEMA, classes, eval_split, has_exploration, series, train_counts
from ..rundir.fsio import atomic_write_bytes
from ..rundir.store import check_regular, read_json_file

MAX_ROWS = 1_000_000
MAX_BYTES = 1 << 30  # uncompressed, as the file's footer declares it
_REQUIRED = ("iteration", "split", "class")  # never null
_NUMBERS = ("accuracy", "coverage", "train_loss", "wall_seconds", "pass_at_k", "pass_at_1", "majority",
            "distinct_correct", "kept_len_mean", "kept_len_std", "first_sample", "verifier_at_k",
            "temperature")  # null or finite


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of ``run_dir/metrics.parquet``, checked: a truncated, damaged or foreign file,
    or one too large, is an ``IntegrityError`` naming it (the file is read while a run may be
    writing it: it is replaced atomically, so it is whole or the previous version)."""
    path = run_dir / "metrics.parquet"
    if not path.exists():
        raise UserError(f"{run_dir}: no metrics.parquet (not a run directory, or no iteration finished yet)")

    def bad(why: str) -> IntegrityError:
        return IntegrityError(f"{path}: not a readable star-engine metrics file ({why})")

    check_regular(path, "metrics file")
    try:
        meta = pq.ParquetFile(path).metadata
        declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if meta.num_rows > MAX_ROWS or declared > MAX_BYTES:
            raise bad(f"{meta.num_rows} rows, {declared} bytes: more than the limits of {MAX_ROWS} rows, "
                      f"{MAX_BYTES} bytes")
        table = pq.read_table(path)
        missing = [f.name for f in METRICS_SCHEMA if f.name not in table.column_names]
        if [m for m in missing if m not in LATER_COLUMNS]:
            raise bad(f"missing columns: {', '.join(missing)}")
        for m in missing:  # a run of a version before these columns
            table = table.append_column(METRICS_SCHEMA.field(m), pa.nulls(len(table), METRICS_SCHEMA.field(m).type))
        rows = table.select(METRICS_SCHEMA.names).cast(METRICS_SCHEMA).to_pylist()
    except IntegrityError:
        raise
    except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, KeyError, OverflowError) as e:
        raise bad(f"{type(e).__name__}: {e}") from None
    for i, r in enumerate(rows):
        if any(r[k] is None for k in _REQUIRED) or any(r[k] is not None and not math.isfinite(r[k]) for k in _NUMBERS):
            raise bad(f"row {i}: {', '.join(_REQUIRED)} must be set and {', '.join(_NUMBERS)} finite")
    return rows


def _under(r: dict, checker: str) -> float | None:
    """Row ``r``'s accuracy under the ``[evaluation] checkers`` entry ``checker`` (None: none)."""
    return next((c["accuracy"] for c in r.get("checkers") or () if c["checker"] == checker), None)


def class_table(rows: Sequence[dict], name: str, checker: str | None = None) -> list[str]:
    """Markdown: eval accuracy (%) per iteration, one column per class and "all" (under the
    ``[evaluation] checkers`` entry ``checker``; None: the task's checker)."""
    split = eval_split(rows)
    columns = [*classes(rows, split), "all"]
    acc = {(r["iteration"], r["class"]): r["accuracy"] if checker is None else _under(r, checker)
           for r in rows if r["split"] == split}
    what = "" if checker is None else f" under {checker}"
    out = [f"{name}, {split} accuracy (%) per class{what}:", "", "| iteration | " + " | ".join(columns) + " |",
           "| ---: |" + " ---: |" * len(columns)]
    for n in sorted({it for it, _ in acc}):
        cells = ["–" if (a := acc.get((n, c))) is None else f"{100 * a:.1f}" for c in columns]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def reading(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> str:
    """One paragraph in words: the overall change, each class's, when each class first
    passed half, the fine-tuning set's size and, with ``other``, the final difference."""
    split = eval_split(rows)
    x, y = series(rows, split, "all")
    if not x:
        return f"{name} has no {split} accuracy yet."
    words = [f"{name}: {split} accuracy went from {y[0]:.1f}% at iteration {x[0]} to {y[-1]:.1f}% at "
             f"iteration {x[-1]} ({y[-1] - y[0]:+.1f} points)."]
    changes, firsts, fell = [], [], []
    for c in classes(rows, split):
        cx, cy = series(rows, split, c)
        if not cx:
            continue
        changes.append(f"{c} {cy[0]:.0f}→{cy[-1]:.0f}")
        if cy[-1] <= cy[0]:
            fell.append(c)
        half = next((it for it, a in zip(cx, cy) if a >= 50), None)
        if half is not None:
            firsts.append(f"{c} at iteration {half}")
    if changes:
        words.append("Per class: " + ", ".join(changes) + ".")
        words.append("Every class ended above its start." if not fell else
                     f"Not above its start: {', '.join(fell)}.")
    if firsts:
        words.append("First at 50% or more: " + ", ".join(firsts) + ".")
    counts = [t for t in train_counts(rows) if t[0] > 0]
    if counts:
        words.append(f"The fine-tuning set held {', '.join(str(t[1]) for t in counts)} examples in iterations "
                     f"{counts[0][0]}–{counts[-1][0]}; {', '.join(str(t[2]) for t in counts)} rationales were "
                     f"right only with the hint (rationalized, before the filters).")
    if other is not None:
        _, yb = series(other, eval_split(other), "all")
        if yb:
            diff = round(y[-1] - yb[-1], 1)
            where = "the same as" if diff == 0 else f"{abs(diff):.1f} points {'below' if diff > 0 else 'above'}"
            words.append(f"{other_name} ended at {yb[-1]:.1f}%, {where} {name}.")
    return " ".join(words)


def sampling_table(rows: Sequence[dict], name: str) -> list[str]:
    """Markdown: pass@k and majority vote of the sampled evaluation, and the exploration
    metrics of rationale generation, per iteration (nothing when the run has none)."""
    if not has_exploration(rows):
        return []
    split = eval_split(rows)
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}"  # noqa: E731
    num = lambda v: "–" if v is None else f"{v:.2f}"  # noqa: E731
    by_it: dict[int, dict[str, dict]] = {}
    for r in rows:
        if r["class"] == "all":
            by_it.setdefault(r["iteration"], {})[r["split"]] = r
    out = ["", f"{name}, sampling and exploration (k: samples per question; lengths in tokens):", "",
           f"| iteration | {split} greedy | {split} pass@k (k) | {split} majority | train solved among k (k) | "
           "distinct correct / solved | kept length mean ± std |", "| ---: |" + " ---: |" * 6]
    for n in sorted(by_it):
        d, t = by_it[n].get(split) or {}, by_it[n].get("train") or {}
        out.append(f"| {n} | {pct(d.get('accuracy'))} | {pct(d.get('pass_at_k'))} ({d.get('pass_k') or '–'}) | "
                   f"{pct(d.get('majority'))} | {pct(t.get('pass_at_k'))} ({t.get('pass_k') or '–'}) | "
                   f"{num(t.get('distinct_correct'))} | "
                   f"{num(t.get('kept_len_mean'))} ± {num(t.get('kept_len_std'))} |")
    return out


def successors_table(rows: Sequence[dict], name: str) -> list[str]:
    """Markdown: what STaR's successors add, per iteration, where the run has it: the verifier's
    top-ranked answer (verifier@k) beside the first sample, the tuned temperature, the groups of
    samples all right / all wrong and what the filters dropped (nothing when the run has none)."""
    split = eval_split(rows)
    by_it: dict[int, dict[str, dict]] = {}
    for r in rows:
        if r["class"] == "all":
            by_it.setdefault(r["iteration"], {})[r["split"]] = r
    cols = [("verifier_at_k", split, f"{split} verifier@k"), ("first_sample", split, f"{split} first sample"),
            ("temperature", "train", "temperature"), ("groups_all_right", "train", "groups all right"),
            ("groups_all_wrong", "train", "groups all wrong")]
    shown = [c for c in cols if any((d.get(c[1]) or {}).get(c[0]) is not None for d in by_it.values())]
    dropped = any((d.get("train") or {}).get("rejected") for d in by_it.values())
    if not any(c[0] in ("verifier_at_k", "temperature", "groups_all_right") for c in shown):
        return []

    def cell(key: str, r: dict) -> str:
        v = r.get(key)
        return "–" if v is None else f"{100 * v:.1f}" if key in ("verifier_at_k", "first_sample") else f"{v:g}"

    head = [label for _, _, label in shown] + (["filters: examples (questions) dropped"] if dropped else [])
    out = ["", f"{name}, STaR's successors (docs/successors.md):", "", "| iteration | " + " | ".join(head) + " |",
           "| ---: |" + " ---: |" * len(head)]
    for n in sorted(by_it):
        cells = [cell(key, by_it[n].get(where) or {}) for key, where, _ in shown]
        if dropped:
            rej = (by_it[n].get("train") or {}).get("rejected") or []
            cells.append(", ".join(f"{c['filter']} {c['examples']} ({c['questions']})" for c in rej) or "–")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def checker_tables(rows: Sequence[dict], name: str, own: str = "") -> list[str]:
    """Markdown: the eval accuracy (%) under each ``[evaluation] checkers`` entry beside the task's
    checker's (``own``) per iteration, with the answers it gave up on; per class when there are
    classes (nothing when the run has no such entries)."""
    split = eval_split(rows)
    alls = sorted((r for r in rows if r["split"] == split and r["class"] == "all" and r.get("checkers")),
                  key=lambda r: r["iteration"])
    if not alls:
        return []
    labels = list(dict.fromkeys(c["checker"] for r in alls for c in r["checkers"]))
    def pct(v: float | None) -> str:
        return "–" if v is None else f"{100 * v:.1f}"

    def cell(c: dict | None) -> str:
        return "–" if c is None else pct(c["accuracy"]) + (f" ({c['timed_out']} timed out)" if c["timed_out"] else "")

    own = own or "task checker"
    out = ["", f"{name}, {split} accuracy (%) by checker ({own}, the task's, decides what is kept):", "",
           f"| iteration | {own} | " + " | ".join(labels) + " |", "| ---: |" + " ---: |" * (len(labels) + 1)]
    for r in alls:
        by = {c["checker"]: c for c in r["checkers"]}
        out.append(f"| {r['iteration']} | {pct(r['accuracy'])} | " + " | ".join(cell(by.get(x)) for x in labels)
                   + " |")
    for label in labels if classes(rows, split) else ():
        out += ["", *class_table(rows, name, label)]
    return out


def markdown(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str, own: str = "",
             title: str = "", runs: str = "", image: str = "report.png") -> str:
    """``report.md``: the runs labelled ``name`` and ``other_name``; ``title``, the heading (default
    ``name``); ``runs``, a line saying which run each label stands for; ``image``, the plot's file."""
    split = eval_split(rows)
    lines = [f"# STaR run: {title or name}", "", *([runs, ""] if runs else []), f"![accuracy]({image})", "",
             reading(rows, name, other, other_name), "",
             f"| iteration | {split} accuracy | train accuracy | rationalized | kept | steps | coverage |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_it: dict[int, dict[str, dict]] = {}
    for r in rows:
        if r["class"] == "all":
            by_it.setdefault(r["iteration"], {})[r["split"]] = r
    for n in sorted(by_it):
        d, t = by_it[n].get(split), by_it[n].get("train")
        fmt = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        lines.append(f"| {n} | {fmt(d and d['accuracy'])} | {fmt(t and t['accuracy'])} | "
                     f"{t['rationalized'] if t else '–'} | {t['kept'] if t else '–'} | "
                     f"{(t or d or {}).get('train_steps', '–')} | {fmt(t and t['coverage'])} |")
    lines += ["", *class_table(rows, name), *sampling_table(rows, name), *successors_table(rows, name),
              *checker_tables(rows, name, own)]
    if other is not None:
        xa, ya = series(rows, split, "all")
        xb, yb = series(other, eval_split(other), "all")
        lines += ["", *class_table(other, other_name),
                  "", f"Final {split} accuracy: {name} {ya[-1] if ya else float('nan'):.1f}% vs "
                      f"{other_name} {yb[-1] if yb else float('nan'):.1f}%"]
    return "\n".join(lines) + "\n"


def _config(run_dir: Path, section: str, key: str, default: str) -> str:
    """``config.json``'s string ``section.key`` (``default`` if unreadable)."""
    try:
        value = read_json_file(run_dir / "config.json", 64 << 20, "config.json")[section][key]
    except (UserError, KeyError, TypeError):
        return default
    value = value.get("name") if isinstance(value, dict) else value
    return value if isinstance(value, str) else default


def _name(run_dir: Path) -> str:
    """The experiment's name from its config.json (the folder's name if unreadable)."""
    return _config(run_dir, "experiment", "name", run_dir.name)


def directory_labels(a: Path, b: Path) -> tuple[str, str]:
    """The trailing parts of two run directories' paths that tell them apart (``runs/x/run``
    and ``runs/y/run``: ``x/run`` and ``y/run``; a symbolic link by its own name)."""
    if Path(a).resolve() == Path(b).resolve():
        raise UserError(f"--compare: {b} is the run directory being reported; compare it with another run")
    parts_a, parts_b = Path(os.path.abspath(a)).parts, Path(os.path.abspath(b)).parts
    for k in range(1, max(len(parts_a), len(parts_b)) + 1):
        la, lb = ("/".join(p[-k:]).lstrip("/") or "/" for p in (parts_a, parts_b))
        if la != lb:
            return la, lb
    raise AssertionError("distinct paths have distinct suffixes")


def run_labels(run_dir: Path, compare: Path | None, labels: Sequence[str] = ()) -> tuple[str, str]:
    """How the report names the run (and the compared run): ``labels`` (``--label``, in that
    order), the rest by default: the experiment's name alone, the run directories with
    ``--compare``."""
    if len(labels) > (2 if compare else 1):
        raise UserError(f"--label: given {len(labels)} times; once for RUN_DIR"
                        + (" and once for the --compare run" if compare else " (twice only with --compare)"))
    if any(not s.strip() for s in labels):
        raise UserError("--label: must not be empty")
    default = directory_labels(run_dir, compare) if compare else (_name(run_dir), "")
    out = (*labels, *default[len(labels):])
    if compare and out[0] == out[1]:
        raise UserError(f"--label: both runs would be labelled {out[0]!r}; give each its own label")
    return out[0], out[1]


@dataclass(frozen=True)
class Report:
    """What ``write_report`` wrote: ``path`` (report.md; report.png beside it), the run's metric
    rows and the reading in words (what ``star-engine report`` prints)."""

    path: Path
    rows: list[dict]
    reading: str


def comparison_stem(run_dir: Path, compare: Path) -> str:
    """The file name (less .md / .png) of ``report RUN_DIR --compare OTHER``'s report:
    ``report_vs_<OTHER's directory label, sanitised>``, beside the run's own report.md, which
    it leaves alone (each compared run its own pair of files)."""
    other = directory_labels(run_dir, compare)[1]
    return "report_vs_" + (re.sub(r"[^A-Za-z0-9.+=-]+", "-", other).strip("-.") or "run")[:100]


def write_report(run_dir: Path, compare: Path | None = None, labels: Sequence[str] = ()) -> Report:
    """Write ``report.md`` and ``report.png`` of ``run_dir``; with ``compare`` (a second run,
    read only) ``comparison_stem``'s .md and .png instead, leaving the run's own report as it is."""
    name, other_name = run_labels(run_dir, compare, labels)
    rows = read_metrics(run_dir)
    other = read_metrics(compare) if compare else None
    from .plot import plot  # matplotlib is imported only to draw

    stem = comparison_stem(run_dir, compare) if compare else "report"
    md, png = run_dir / f"{stem}.md", run_dir / f"{stem}.png"
    for out in (png, md):  # both replaceable before either is written
        if in_the_way(out):
            raise UserError(f"{out}: exists and is not a file (the report writes one there); move it away")
    atomic_write_bytes(png, plot(rows, name, other, other_name))
    own = _config(run_dir, "task", "checker", "")
    title, runs = _name(run_dir), ""
    if compare:
        runs = (f"Runs: **{name}** is {run_dir} (experiment {title}); **{other_name}** is {compare} "
                f"(experiment {_name(compare)}).")
    atomic_write_bytes(md, markdown(rows, name, other, other_name, own, title, runs, png.name).encode())
    return Report(md, rows, reading(rows, name, other, other_name))
