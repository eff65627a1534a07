"""``star-engine report RUN_DIR [--compare OTHER]``: a plot and a Markdown summary."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from .errors import UserError  # noqa: E402
from .store import atomic_write_bytes  # noqa: E402


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.parquet"
    if not path.exists():
        raise UserError(f"{run_dir}: no metrics.parquet (not a run directory, or no iteration finished yet)")
    return pq.read_table(path).to_pylist()


def _eval_split(rows: Sequence[dict]) -> str:
    splits = [r["split"] for r in rows if r["split"] != "train"]
    return splits[0] if splits else "train"


def _series(rows: Sequence[dict], split: str, cls: str) -> tuple[list[int], list[float]]:
    pts = sorted((r["iteration"], r["accuracy"]) for r in rows if r["split"] == split and r["class"] == cls
                 and r["accuracy"] is not None)
    return [p[0] for p in pts], [100 * p[1] for p in pts]


def plot(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> bytes:
    split = _eval_split(rows)
    classes = sorted({r["class"] for r in rows if r["split"] == split and r["class"] != "all"},
                     key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    x, y = _series(rows, split, "all")
    ax1.plot(x, y, "o-", lw=2.5, color="black", label=f"{name}: all")
    cmap = plt.get_cmap("viridis")
    for i, c in enumerate(classes):
        x, y = _series(rows, split, c)
        ax1.plot(x, y, ".-", alpha=0.8, color=cmap(i / max(1, len(classes) - 1)), label=f"{name}: {c}")
    if other is not None:
        x, y = _series(other, _eval_split(other), "all")
        ax1.plot(x, y, "s--", lw=2.5, color="tab:red", label=f"{other_name}: all")
    ax1.set(xlabel="iteration", ylabel=f"{split} accuracy (%)", title=f"{split} accuracy per iteration",
            ylim=(0, 100))
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.grid(alpha=0.3)
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
                 label=f"{other_name}: kept")
    ax2.set(xlabel="iteration", ylabel="examples", title="fine-tuning set per iteration")
    ax2.grid(alpha=0.3)
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
        return str(json.loads((run_dir / "config.json").read_text())["experiment"]["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return run_dir.name


def write_report(run_dir: Path, compare: Path | None = None) -> Path:
    rows = read_metrics(run_dir)
    other = read_metrics(compare) if compare else None
    name, other_name = _name(run_dir), _name(compare) if compare else ""
    atomic_write_bytes(run_dir / "report.png", plot(rows, name, other, other_name))
    atomic_write_bytes(run_dir / "report.md", markdown(rows, name, other, other_name).encode())
    return run_dir / "report.md"
