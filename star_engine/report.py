"""``star-engine report RUN_DIR [--compare OTHER]``: a plot and a Markdown summary."""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from .errors import IntegrityError, UserError  # noqa: E402
from .metrics import LATER_COLUMNS, METRICS_SCHEMA, natural  # noqa: E402
from .store import atomic_write_bytes, read_json_file  # noqa: E402


MAX_ROWS = 1_000_000
MAX_CLASSES = 24  # plotted per run (the Markdown table has them all)
MAX_BYTES = 1 << 30  # uncompressed, as the file's footer declares it
_REQUIRED = ("iteration", "split", "class")  # never null
_NUMBERS = ("accuracy", "coverage", "train_loss", "wall_seconds", "pass_at_k", "pass_at_1", "majority",
            "distinct_correct", "kept_len_mean", "kept_len_std")  # null or finite


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of ``run_dir/metrics.parquet``, checked: a truncated, damaged or foreign file,
    or one too large, is an ``IntegrityError`` naming it (the file is read while a run may be
    writing it: it is replaced atomically, so it is whole or the previous version)."""
    path = run_dir / "metrics.parquet"
    if not path.exists():
        raise UserError(f"{run_dir}: no metrics.parquet (not a run directory, or no iteration finished yet)")

    def bad(why: str) -> IntegrityError:
        return IntegrityError(f"{path}: not a readable star-engine metrics file ({why})")

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


def _eval_split(rows: Sequence[dict]) -> str:
    splits = [r["split"] for r in rows if r["split"] != "train"]
    return splits[0] if splits else "train"


def _series(rows: Sequence[dict], split: str, cls: str) -> tuple[list[int], list[float]]:
    pts = sorted((r["iteration"], r["accuracy"]) for r in rows if r["split"] == split and r["class"] == cls
                 and r["accuracy"] is not None)
    return [p[0] for p in pts], [100 * p[1] for p in pts]


def _short(label: str, n: int = 48) -> str:
    """A plot label: at most ``n`` characters, "$" shown as itself (not as mathtext)."""
    label = label if len(label) <= n else label[: n - 1] + "…"
    return label.replace("$", r"\$")


def _classes(rows: Sequence[dict], split: str) -> list[str]:
    """The eval split's classes other than "all", numbers in numeric order."""
    return sorted({r["class"] for r in rows if r["split"] == split and r["class"] != "all"}, key=natural)


def _train_counts(rows: Sequence[dict]) -> list[tuple[int, int, int]]:
    """(iteration, kept, rationalized) of the fine-tuning set, per iteration."""
    return sorted((r["iteration"], r["kept"] or 0, r["rationalized"] or 0) for r in rows
                  if r["split"] == "train" and r["class"] == "all")


def _accuracy_panel(ax, rows: Sequence[dict], name: str, classes: Sequence[str]) -> None:
    """One run's eval accuracy per iteration: every class (the same colour in every
    panel) and the overall accuracy in black."""
    split = _eval_split(rows)
    cmap = plt.get_cmap("viridis")
    for i, c in enumerate(classes):
        x, y = _series(rows, split, c)
        if x:
            ax.plot(x, y, "o-", ms=4, alpha=0.85, color=cmap(0.85 * i / max(1, len(classes) - 1)), label=_short(c))
    x, y = _series(rows, split, "all")
    ax.plot(x, y, "o-", lw=2.5, color="black", label="all")
    ax.set(xlabel="iteration", ylabel=_short(f"{split} accuracy (%)"),
           title=_short(f"{name}: {split} accuracy per class"), ylim=(0, 100))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # (a run with no evaluation yet has none)
        ax.legend(fontsize=7, ncol=2, title="class", title_fontsize=7)


def _overlay_panel(ax, runs: Sequence[tuple[Sequence[dict], str]]) -> None:
    """Every run's overall eval accuracy (solid) and train coverage (dashed) on one axes."""
    for (rows, name), color in zip(runs, ("black", "tab:red")):
        x, y = _series(rows, _eval_split(rows), "all")
        ax.plot(x, y, "o-", lw=2, color=color, label=_short(f"{name}: {_eval_split(rows)} accuracy"))
        cov = sorted((r["iteration"], 100 * r["coverage"]) for r in rows
                     if r["split"] == "train" and r["class"] == "all" and r["coverage"] is not None)
        if cov:
            ax.plot(*zip(*cov), "s--", ms=3, color=color, alpha=0.6, label=_short(f"{name}: train coverage"))
    ax.set(xlabel="iteration", ylabel="%", title="overall accuracy and coverage")
    ax.set_ylim(0, min(100, ax.get_ylim()[1] * 1.1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _has_exploration(rows: Sequence[dict]) -> bool:
    return any(r["pass_at_k"] is not None or r["kept_len_mean"] is not None for r in rows)


def _train_all(rows: Sequence[dict]) -> list[dict]:
    return sorted((r for r in rows if r["split"] == "train" and r["class"] == "all"), key=lambda r: r["iteration"])


def _exploration_panel(ax, runs: Sequence[tuple[Sequence[dict], str]]) -> None:
    """Exploration: the share of train questions with a right rationale among k (train pass@k),
    eval pass@k and majority vote (left axis, %); distinct right rationales per solved question
    (right axis)."""
    right = ax.twinx()
    for (rows, name), style in zip(runs, ("-", "--")):
        evals = sorted((r for r in rows if r["split"] == _eval_split(rows) and r["class"] == "all"
                        and r["pass_at_k"] is not None), key=lambda r: r["iteration"])
        for src, col, color, label, axis in (
                (_train_all(rows), "pass_at_k", "tab:green", "train: solved among k", ax),
                (evals, "pass_at_k", "tab:blue", "eval pass@k", ax),
                (evals, "majority", "tab:cyan", "eval majority vote", ax),
                (_train_all(rows), "distinct_correct", "tab:purple", "distinct right / solved", right)):
            pts = [(r["iteration"], r[col] * (1 if axis is right else 100)) for r in src if r[col] is not None]
            if pts:
                axis.plot(*zip(*pts), "o" + style, ms=3, color=color, label=_short(f"{name}: {label}"))
    ax.set(xlabel="iteration", ylabel="%", title="exploration")
    right.set_ylabel("distinct right rationales per solved question")
    right.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, fontsize=6)


def _exploitation_panel(ax, runs: Sequence[tuple[Sequence[dict], str]]) -> None:
    """Exploitation: the kept set's mean length per iteration, +- one standard deviation."""
    for (rows, name), color in zip(runs, ("tab:brown", "tab:gray")):
        pts = [(r["iteration"], r["kept_len_mean"], r["kept_len_std"] or 0.0) for r in _train_all(rows)
               if r["kept_len_mean"] is not None]
        if pts:
            x, m, sd = zip(*pts)
            ax.plot(x, m, "o-", ms=3, color=color, label=_short(f"{name}: mean"))
            ax.fill_between(x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], color=color,
                            alpha=0.2, label=_short(f"{name}: ± 1 sd"))
    ax.set(xlabel="iteration", ylabel="tokens", title="exploitation: kept rationale length")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def figure(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> plt.Figure:
    """Accuracy per iteration and class of the run (and of ``other``, in its own panel
    on the same axes), then the fine-tuning set per iteration of both; with ``other`` both
    runs' overall accuracy in one panel; exploration metrics when the runs have them."""
    runs = [(rows, name)] + ([(other, other_name)] if other is not None else [])
    classes = sorted({c for r, _ in runs for c in _classes(r, _eval_split(r))}, key=natural)[:MAX_CLASSES]
    explore = any(_has_exploration(r) for r, _ in runs)
    n_panels = len(runs) + 1 + (other is not None) + 2 * explore
    ncols = min(3, n_panels)
    fig, grid = plt.subplots(-(-n_panels // ncols), ncols, figsize=(6 * ncols, 4.8 * -(-n_panels // ncols)),
                             squeeze=False)
    axes = list(grid.flat)
    for extra in axes[n_panels:]:
        extra.remove()
    axes = axes[:n_panels]
    for ax, (r, n) in zip(axes, runs):
        _accuracy_panel(ax, r, n, classes)
    ax = axes[len(runs)]
    width = 0.8 / (len(runs) + 1)
    bars = [(f"{name}: kept", [(t[0], t[1]) for t in _train_counts(rows)], "tab:blue", None),
            (f"{name}: rationalized (correct with hint)", [(t[0], t[2]) for t in _train_counts(rows)], "tab:orange",
             None)]
    if other is not None:
        bars.append((f"{other_name}: kept", [(t[0], t[1]) for t in _train_counts(other)], "tab:red", "//"))
    for j, (label, pts, color, hatch) in enumerate(bars):
        if pts:
            ax.bar([i + (j - (len(bars) - 1) / 2) * width for i, _ in pts], [v for _, v in pts], width=width,
                   color=color, hatch=hatch, alpha=0.85 if hatch is None else 0.5, label=_short(label))
    ax.set(xlabel="iteration", ylabel="examples", title="fine-tuning set per iteration")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    if other is not None:
        _overlay_panel(axes[len(runs) + 1], runs)
    if explore:
        _exploration_panel(axes[-2], runs)
        _exploitation_panel(axes[-1], runs)
    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def plot(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> bytes:
    with warnings.catch_warnings():  # layout notes from matplotlib are no concern of the user's
        warnings.simplefilter("ignore")
        fig = figure(rows, name, other, other_name)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _under(r: dict, checker: str) -> float | None:
    """Row ``r``'s accuracy under the ``[evaluation] checkers`` entry ``checker`` (None: none)."""
    return next((c["accuracy"] for c in r.get("checkers") or () if c["checker"] == checker), None)


def class_table(rows: Sequence[dict], name: str, checker: str | None = None) -> list[str]:
    """Markdown: eval accuracy (%) per iteration, one column per class and "all" (under the
    ``[evaluation] checkers`` entry ``checker``; None: the task's checker)."""
    split = _eval_split(rows)
    classes = [*_classes(rows, split), "all"]
    acc = {(r["iteration"], r["class"]): r["accuracy"] if checker is None else _under(r, checker)
           for r in rows if r["split"] == split}
    what = "" if checker is None else f" under {checker}"
    out = [f"{name}, {split} accuracy (%) per class{what}:", "", "| iteration | " + " | ".join(classes) + " |",
           "| ---: |" + " ---: |" * len(classes)]
    for n in sorted({it for it, _ in acc}):
        cells = ["–" if acc.get((n, c)) is None else f"{100 * acc[(n, c)]:.1f}" for c in classes]
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def reading(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> str:
    """One paragraph in words: the overall change, each class's, when each class first
    passed half, the fine-tuning set's size and, with ``other``, the final difference."""
    split = _eval_split(rows)
    x, y = _series(rows, split, "all")
    if not x:
        return f"{name} has no {split} accuracy yet."
    words = [f"{name}: {split} accuracy went from {y[0]:.1f}% at iteration {x[0]} to {y[-1]:.1f}% at "
             f"iteration {x[-1]} ({y[-1] - y[0]:+.1f} points)."]
    changes, firsts, fell = [], [], []
    for c in _classes(rows, split):
        cx, cy = _series(rows, split, c)
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
    counts = [t for t in _train_counts(rows) if t[0] > 0]
    if counts:
        words.append(f"The fine-tuning set held {', '.join(str(t[1]) for t in counts)} examples in iterations "
                     f"{counts[0][0]}–{counts[-1][0]}, of which {', '.join(str(t[2]) for t in counts)} were "
                     f"right only with the hint (rationalized).")
    if other is not None:
        _, yb = _series(other, _eval_split(other), "all")
        if yb:
            diff = y[-1] - yb[-1]
            words.append(f"{other_name} ended at {yb[-1]:.1f}%, {abs(diff):.1f} points "
                         f"{'below' if diff >= 0 else 'above'} {name}.")
    return " ".join(words)


def sampling_table(rows: Sequence[dict], name: str) -> list[str]:
    """Markdown: pass@k and majority vote of the sampled evaluation, and the exploration
    metrics of rationale generation, per iteration (nothing when the run has none)."""
    if not _has_exploration(rows):
        return []
    split = _eval_split(rows)
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


def checker_tables(rows: Sequence[dict], name: str, own: str = "") -> list[str]:
    """Markdown: the eval accuracy (%) under each ``[evaluation] checkers`` entry beside the task's
    checker's (``own``) per iteration, with the answers it gave up on; per class when there are
    classes (nothing when the run has no such entries)."""
    split = _eval_split(rows)
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
    for label in labels if _classes(rows, split) else ():
        out += ["", *class_table(rows, name, label)]
    return out


def markdown(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str, own: str = "") -> str:
    split = _eval_split(rows)
    lines = [f"# STaR run: {name}", "", "![accuracy](report.png)", "", reading(rows, name, other, other_name), "",
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
    lines += ["", *class_table(rows, name), *sampling_table(rows, name), *checker_tables(rows, name, own)]
    if other is not None:
        xa, ya = _series(rows, split, "all")
        xb, yb = _series(other, _eval_split(other), "all")
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


def write_report(run_dir: Path, compare: Path | None = None) -> Path:
    rows = read_metrics(run_dir)
    other = read_metrics(compare) if compare else None
    name, other_name = _name(run_dir), _name(compare) if compare else ""
    atomic_write_bytes(run_dir / "report.png", plot(rows, name, other, other_name))
    own = _config(run_dir, "task", "checker", "")
    atomic_write_bytes(run_dir / "report.md", markdown(rows, name, other, other_name, own).encode())
    return run_dir / "report.md"
