"""``compare.png``: groups of runs side by side (``star_engine.report.compare`` hands over the numbers).

One panel per split: each group's mean accuracy per iteration (a line), ± the sample standard
deviation (a band) and its runs (thin, faint lines); then, per evaluation split with classes, the
accuracy per class at the last iteration each group's runs all reached (bars at the mean, error
bars of one sample standard deviation). Each panel's legend sits below it, as in ``report.png``.
"""

from __future__ import annotations

import functools
import io
import statistics
import warnings
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..rundir.metrics import natural  # noqa: E402
from .plot import MAX_CLASSES, PANEL, label  # noqa: E402

COLORS = plt.get_cmap("tab10")
Points = dict[int, list[float]]  # iteration -> the group's runs' accuracies, 0..1



@dataclass(frozen=True)
class Curve:
    """One group's curve of one split: ``label``, its ``runs``' accuracies by iteration and
    the group's (``by_iteration``: every run's value at each iteration)."""

    label: str
    runs: list[dict[int, float]]
    by_iteration: Points


@dataclass(frozen=True)
class Bars:
    """One group's per-class accuracies (``by_class``, every run's) at iteration ``last``."""

    label: str
    last: int | None
    by_class: dict[str, list[float]]


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    pct = [100 * v for v in values]
    return statistics.fmean(pct), statistics.stdev(pct) if len(pct) > 1 else 0.0


def _accuracy_panel(ax: Any, split: str, curves: Sequence[Curve]) -> None:
    for i, c in enumerate(curves):
        color = COLORS(i % 10)
        for run in c.runs if len(c.runs) > 1 else ():
            pts = sorted(run.items())
            if pts:
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "-", lw=0.8, alpha=0.35, color=color)
        x = list(c.by_iteration)
        stats = [_mean_sd(vs) for vs in c.by_iteration.values()]
        ax.plot(x, [m for m, _ in stats], "o-", ms=4, lw=2, color=color, label=label(f"{c.label} (n={len(c.runs)})"))
        if any(sd for _, sd in stats):
            ax.fill_between(x, [m - sd for m, sd in stats], [m + sd for m, sd in stats], color=color, alpha=0.18)
    ax.set(xlabel="iteration", ylabel=f"{split} accuracy (%)", title=f"{split} accuracy: mean ± sample sd",
           ylim=(0, 100))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _class_panel(ax: Any, split: str, bars: Sequence[Bars]) -> None:
    cls = sorted({c for b in bars for c in b.by_class if c != "all"}, key=natural)
    cls = [*cls[:MAX_CLASSES], "all"]
    width = 0.8 / len(bars)
    for i, b in enumerate(bars):
        stats = [_mean_sd(b.by_class[c]) if b.by_class.get(c) else (0.0, 0.0) for c in cls]
        ax.bar([j + (i - (len(bars) - 1) / 2) * width for j in range(len(cls))], [m for m, _ in stats],
               width=width, yerr=[sd for _, sd in stats], capsize=2, color=COLORS(i % 10), alpha=0.85,
               label=label(f"{b.label} (iteration {b.last})"))
    ax.set_xticks(range(len(cls)), [label(c)[:12] for c in cls], rotation=45 if len(cls) > 8 else 0)
    ax.set(xlabel="class", ylabel=f"{split} accuracy (%)", title=f"{split} per class at the last iteration",
           ylim=(0, 100))


def figure(curves: dict[str, list[Curve]], bars: dict[str, list[Bars]]) -> Any:
    """A panel per split of ``curves``, then one per split of ``bars``."""
    panels: list[Callable[[Any], None]] = [
        *(functools.partial(_accuracy_panel, split=k, curves=v) for k, v in curves.items()),
        *(functools.partial(_class_panel, split=k, bars=v) for k, v in bars.items())]
    its = sorted({it for cs in curves.values() for c in cs for it in c.by_iteration})
    ncols = max(1, min(3, len(panels)))
    nrows = max(1, -(-len(panels) // ncols))
    fig = plt.figure(figsize=(PANEL[0] * ncols, PANEL[1] * nrows), layout="constrained")
    for subfig, draw in zip(fig.subfigures(nrows, ncols, squeeze=False).flat, panels):
        ax = subfig.subplots()
        draw(ax)
        ax.grid(alpha=0.3)
        if its and ax.get_xlabel() == "iteration":  # whole iterations, half an iteration of margin
            ax.set_xlim(its[0] - 0.5, its[-1] + 0.5)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            subfig.legend(handles, labels, loc="outside lower center", ncol=min(2, len(handles)), fontsize=7,
                          frameon=False)
    return fig


def plot(curves: dict[str, list[Curve]], bars: dict[str, list[Bars]]) -> bytes:
    """``figure`` as PNG bytes."""
    with warnings.catch_warnings():  # layout notes from matplotlib are no concern of the user's
        warnings.simplefilter("ignore")
        fig = figure(curves, bars)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
