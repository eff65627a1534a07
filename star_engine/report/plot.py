"""``report.png``: a run's metrics per iteration, one panel each (and a second run's beside them).

Each panel is a subfigure holding its axes and, below them, its legend (``outside lower
center``: constrained layout makes room for it, so a legend never sits on the data and is never
cut by the figure's edge); a label too long for a line is wrapped, not cut. The axes stay
readable whatever the values: iterations are whole numbers with half an iteration of margin
(one iteration is not drawn as 0.945-1.05), counts and lengths start at 0 (an all-zero run
shows no negative counts) and an axis keeps a span of at least one unit when every value is 0.
"""

from __future__ import annotations

import io
import textwrap
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..rundir.metrics import (classes, eval_split, has_exploration, natural, series, train_all, train_counts)  # noqa: E402

MAX_CLASSES = 24  # plotted per run (the Markdown table has them all)
LABEL_WIDTH = 34  # characters per legend line
LABEL_LINES = 3  # lines per legend label (a longer one ends in "…")
PANEL = (6.0, 5.6)  # inches per panel, legend included
Runs = Sequence[tuple[Sequence[dict], str]]


def label(text: str) -> str:
    """A legend label: wrapped at ``LABEL_WIDTH`` characters, at most ``LABEL_LINES`` lines,
    "$" shown as itself (not as mathtext)."""
    lines = textwrap.wrap(text, LABEL_WIDTH, break_on_hyphens=False) or [""]
    if len(lines) > LABEL_LINES:
        lines = lines[:LABEL_LINES]
        lines[-1] = lines[-1][: LABEL_WIDTH - 1] + "…"
    return "\n".join(lines).replace("$", r"\$")


def _title(text: str, n: int = 60) -> str:
    return (text if len(text) <= n else text[: n - 1] + "…").replace("$", r"\$")


def _percent_axis(ax, values: Sequence[float]) -> None:
    """0 to 100 %, or to a little above the largest value when all are small (at least 10 %)."""
    top = max(values, default=0.0)
    ax.set_ylim(0, 100 if top > 60 else max(10.0, 1.15 * top))


def _count_axis(ax, values: Sequence[float], integer: bool = True) -> None:
    """From 0 to a little above the largest value (at least 1): never below 0."""
    ax.set_ylim(0, max(1.0, 1.1 * max(values, default=0.0)))
    if integer:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _accuracy_panel(ax, rows: Sequence[dict], name: str, cls: Sequence[str]) -> None:
    """One run's eval accuracy per iteration: every class (the same colour in every panel)
    and the overall accuracy in black."""
    split = eval_split(rows)
    cmap = plt.get_cmap("viridis")
    for i, c in enumerate(cls):
        x, y = series(rows, split, c)
        if x:
            ax.plot(x, y, "o-", ms=4, alpha=0.85, color=cmap(0.85 * i / max(1, len(cls) - 1)), label=label(c))
    x, y = series(rows, split, "all")
    ax.plot(x, y, "o-", lw=2.5, color="black", label="all")
    ax.set(xlabel="iteration", ylabel=_title(f"{split} accuracy (%)"), title=_title(f"{name}: {split} accuracy"),
           ylim=(0, 100))


def _counts_panel(ax, runs: Runs) -> None:
    """The fine-tuning set per iteration: kept and rationalized of the first run, kept of the second."""
    (rows, name), other = runs[0], runs[1:]
    bars: list[tuple[str, list[tuple[int, int]], str, str | None]] = [(f"{name}: kept", [(t[0], t[1]) for t in train_counts(rows)], "tab:blue", None),
            (f"{name}: rationalized (right with the hint)", [(t[0], t[2]) for t in train_counts(rows)],
             "tab:orange", None)]
    for o_rows, o_name in other:
        bars.append((f"{o_name}: kept", [(t[0], t[1]) for t in train_counts(o_rows)], "tab:red", "//"))
    width = 0.8 / len(bars)
    for j, (text, pts, color, hatch) in enumerate(bars):
        if pts:
            ax.bar([i + (j - (len(bars) - 1) / 2) * width for i, _ in pts], [v for _, v in pts], width=width,
                   color=color, hatch=hatch, alpha=0.85 if hatch is None else 0.5, label=label(text))
    ax.set(xlabel="iteration", ylabel="examples", title="fine-tuning set per iteration")
    _count_axis(ax, [v for _, pts, _, _ in bars for _, v in pts])


def _overlay_panel(ax, runs: Runs) -> None:
    """Every run's overall eval accuracy (solid) and train coverage (dashed) on one axes."""
    values: list[float] = []
    for (rows, name), color in zip(runs, ("black", "tab:red")):
        x, y = series(rows, eval_split(rows), "all")
        ax.plot(x, y, "o-", lw=2, color=color, label=label(f"{name}: {eval_split(rows)} accuracy"))
        cov = sorted((r["iteration"], 100 * r["coverage"]) for r in rows
                     if r["split"] == "train" and r["class"] == "all" and r["coverage"] is not None)
        if cov:
            ax.plot(*zip(*cov), "s--", ms=3, color=color, alpha=0.6, label=label(f"{name}: train coverage"))
        values += y + [v for _, v in cov]
    ax.set(xlabel="iteration", ylabel="%", title="overall accuracy and coverage")
    _percent_axis(ax, values)


def _exploration_panel(ax, runs: Runs) -> list:
    """Exploration: the share of train questions with a right rationale among k (train pass@k),
    eval pass@k and majority vote (left axis, %); distinct right rationales per solved question
    (right axis). Returns the right axis."""
    right = ax.twinx()
    left_values: list[float] = []
    right_values: list[float] = []
    for (rows, name), style in zip(runs, ("-", "--")):
        evals = sorted((r for r in rows if r["split"] == eval_split(rows) and r["class"] == "all"
                        and r["pass_at_k"] is not None), key=lambda r: r["iteration"])
        for src, col, color, text, axis in (
                (train_all(rows), "pass_at_k", "tab:green", "train: solved among k", ax),
                (evals, "pass_at_k", "tab:blue", "eval pass@k", ax),
                (evals, "majority", "tab:cyan", "eval majority vote", ax),
                (train_all(rows), "distinct_correct", "tab:purple", "distinct right / solved", right)):
            pts = [(r["iteration"], r[col] * (1 if axis is right else 100)) for r in src if r[col] is not None]
            if pts:
                axis.plot(*zip(*pts), "o" + style, ms=3, color=color, label=label(f"{name}: {text}"))
                (right_values if axis is right else left_values).extend(v for _, v in pts)
    ax.set(xlabel="iteration", ylabel="%", title="exploration")
    right.set_ylabel("distinct right rationales per solved question")
    _percent_axis(ax, left_values)
    _count_axis(right, right_values, integer=False)
    return [right]


def _exploitation_panel(ax, runs: Runs) -> None:
    """Exploitation: the kept set's mean length per iteration, +- one standard deviation
    (the band cut at 0: no length is negative)."""
    tops: list[float] = []
    for (rows, name), color in zip(runs, ("tab:brown", "tab:gray")):
        pts = [(r["iteration"], r["kept_len_mean"], r["kept_len_std"] or 0.0) for r in train_all(rows)
               if r["kept_len_mean"] is not None]
        if pts:
            x, m, sd = zip(*pts)
            ax.plot(x, m, "o-", ms=3, color=color, label=label(f"{name}: mean"))
            ax.fill_between(x, [max(0.0, a - b) for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)],
                            color=color, alpha=0.2, label=label(f"{name}: ± 1 sd"))
            tops += [a + b for a, b in zip(m, sd)]
    ax.set(xlabel="iteration", ylabel="tokens", title="exploitation: kept rationale length")
    _count_axis(ax, tops, integer=False)


def _iterations(runs: Runs) -> list[int]:
    return sorted({r["iteration"] for rows, _ in runs for r in rows})


def _legend(subfig, axes: Sequence) -> None:
    """The panel's legend below its axes, in as many columns as fit the panel's width."""
    handles, labels = [], []
    for a in axes:
        h, lab = a.get_legend_handles_labels()
        handles += h
        labels += lab
    if not handles:  # (a run with no evaluation yet has none)
        return
    longest = max(len(line) for lab in labels for line in lab.split("\n"))
    ncol = max(1, min(len(handles), int(PANEL[0] * 72 / (4.4 * longest + 36))))  # ~4.4 pt a character at 7 pt
    subfig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=7, frameon=False)


def figure(rows: Sequence[dict], name: str, other: Sequence[dict] | None = None, other_name: str = "") -> plt.Figure:
    """Accuracy per iteration and class of the run (and of ``other``, in its own panel on the
    same axes), then the fine-tuning set per iteration of both; with ``other`` both runs'
    overall accuracy in one panel; exploration metrics when the runs have them. ``name`` and
    ``other_name`` label the runs."""
    runs: list[tuple[Sequence[dict], str]] = [(rows, name)] + ([(other, other_name)] if other is not None else [])
    cls = sorted({c for r, _ in runs for c in classes(r, eval_split(r))}, key=natural)[:MAX_CLASSES]
    explore = any(has_exploration(r) for r, _ in runs)
    panels: list[Callable[[Any], Any]] = [*[(lambda ax, r=r, n=n: _accuracy_panel(ax, r, n, cls)) for r, n in runs],
              lambda ax: _counts_panel(ax, runs)]
    if other is not None:
        panels.append(lambda ax: _overlay_panel(ax, runs))
    if explore:
        panels += [lambda ax: _exploration_panel(ax, runs), lambda ax: _exploitation_panel(ax, runs)]
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = plt.figure(figsize=(PANEL[0] * ncols, PANEL[1] * nrows), layout="constrained")
    subfigs = list(fig.subfigures(nrows, ncols, squeeze=False).flat)
    its = _iterations(runs)
    for subfig, draw in zip(subfigs, panels):
        ax = subfig.subplots()
        twins: list[Any] = draw(ax) or []
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # (one iteration: one tick)
        if its:
            ax.set_xlim(its[0] - 0.5, its[-1] + 0.5)
        _legend(subfig, [ax, *twins])
    return fig


def plot(rows: Sequence[dict], name: str, other: Sequence[dict] | None, other_name: str) -> bytes:
    """``figure`` as PNG bytes."""
    with warnings.catch_warnings():  # layout notes from matplotlib are no concern of the user's
        warnings.simplefilter("ignore")
        fig = figure(rows, name, other, other_name)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
