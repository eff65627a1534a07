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
from .metrics import METRICS_SCHEMA, natural  # noqa: E402
from .store import atomic_write_bytes, read_json_file  # noqa: E402


MAX_ROWS = 1_000_000
MAX_CLASSES = 24  # plotted per run (the Markdown table has them all)
MAX_BYTES = 1 << 30  # uncompressed, as the file's footer declares it
_REQUIRED = ("iteration", "split", "class")  # never null
_NUMBERS = ("accuracy", "coverage", "train_loss", "wall_seconds")  # null or finite


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
        if missing:
            raise bad(f"missing columns: {', '.join(missing)}")
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


def plot(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> bytes:
    with warnings.catch_warnings():  # layout notes from matplotlib are no concern of the user's
        warnings.simplefilter("ignore")
        return _plot(rows, name, other, other_name)


def _plot(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> bytes:
    split = _eval_split(rows)
    classes = sorted({r["class"] for r in rows if r["split"] == split and r["class"] != "all"},
                     key=natural)[:MAX_CLASSES]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    x, y = _series(rows, split, "all")
    ax1.plot(x, y, "o-", lw=2.5, color="black", label=_short(f"{name}: all"))
    cmap = plt.get_cmap("viridis")
    for i, c in enumerate(classes):
        x, y = _series(rows, split, c)
        ax1.plot(x, y, ".-", alpha=0.8, color=cmap(i / max(1, len(classes) - 1)), label=_short(f"{name}: {c}"))
    if other is not None:
        x, y = _series(other, _eval_split(other), "all")
        ax1.plot(x, y, "s--", lw=2.5, color="tab:red", label=_short(f"{other_name}: all"))
    ax1.set(xlabel="iteration", ylabel=_short(f"{split} accuracy (%)"),
            title=_short(f"{split} accuracy per iteration"), ylim=(0, 100))
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.grid(alpha=0.3)
    if ax1.get_legend_handles_labels()[0]:  # (a run with no evaluation yet has none)
        ax1.legend(fontsize=7, ncol=2)
    train = sorted((r["iteration"], r["kept"], r["rationalized"]) for r in rows
                   if r["split"] == "train" and r["class"] == "all")
    if train:
        it = [t[0] for t in train]
        ax2.bar([i - 0.2 for i in it], [t[1] for t in train], width=0.4, label="kept")
        ax2.bar([i + 0.2 for i in it], [t[2] for t in train], width=0.4, label="rationalized (correct with hint)")
    other_train = sorted((r["iteration"], r["kept"]) for r in other or () if r["split"] == "train" and r["class"] == "all")
    if other_train:
        ax2.plot([t[0] for t in other_train], [t[1] for t in other_train], "s--", lw=2, color="tab:red",
                 label=_short(f"{other_name}: kept"))
    ax2.set(xlabel="iteration", ylabel="examples", title="fine-tuning set per iteration")
    ax2.grid(alpha=0.3)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def markdown(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> str:
    split = _eval_split(rows)
    lines = [f"# STaR run: {name}", "", "![accuracy](report.png)", "",
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
    if other is not None:
        xa, ya = _series(rows, split, "all")
        xb, yb = _series(other, _eval_split(other), "all")
        lines += ["", f"Final {split} accuracy: {name} {ya[-1] if ya else float('nan'):.1f}% vs "
                      f"{other_name} {yb[-1] if yb else float('nan'):.1f}%"]
    return "\n".join(lines) + "\n"


def _name(run_dir: Path) -> str:
    """The experiment's name from its config.json (the folder's name if unreadable)."""
    try:
        name = read_json_file(run_dir / "config.json", 64 << 20, "config.json")["experiment"]["name"]
    except (UserError, KeyError, TypeError):
        return run_dir.name
    return name if isinstance(name, str) else run_dir.name


def write_report(run_dir: Path, compare: Path | None = None) -> Path:
    rows = read_metrics(run_dir)
    other = read_metrics(compare) if compare else None
    name, other_name = _name(run_dir), _name(compare) if compare else ""
    atomic_write_bytes(run_dir / "report.png", plot(rows, name, other, other_name))
    atomic_write_bytes(run_dir / "report.md", markdown(rows, name, other, other_name).encode())
    return run_dir / "report.md"
