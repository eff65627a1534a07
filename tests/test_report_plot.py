"""``report.png`` read through matplotlib's artists, not its pixels: every legend inside the
figure and off every axes, no label cut, no negative count, and axes that stay readable for a
run whose every value is 0 (one iteration or several)."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import pytest

from star_engine.report.plot import figure, label

LONG = "addition_no_rationalization_seed_2"


def rows(dev: list[float], *, zero: bool = False, explore: bool = True) -> list[dict]:
    """metrics.parquet rows as ``read_metrics`` returns them: dev accuracy per iteration (overall
    and two classes) and the train rows of iterations >= 1; ``zero``: nothing kept, solved or
    generated right."""
    out = []
    for n, acc in enumerate(dev):
        for cls, a in (("all", acc), ("1", min(1.0, 2 * acc)), ("2", acc / 2)):
            out.append({"iteration": n, "split": "dev", "class": cls, "accuracy": a, "coverage": None,
                        "pass_at_k": a if explore else None, "majority": a if explore else None,
                        "kept": None, "rationalized": None, "distinct_correct": None, "kept_len_mean": None,
                        "kept_len_std": None})
        if n:
            out.append({"iteration": n, "split": "train", "class": "all", "accuracy": acc / 2,
                        "rationalized": 0 if zero else 10 * n, "kept": 0 if zero else 20 * n,
                        "coverage": 0.0 if zero else 0.1 * n, "pass_at_k": acc if explore else None,
                        "majority": None, "distinct_correct": 0.0 if zero else 1.5,
                        "kept_len_mean": None if zero else 30.0, "kept_len_std": None if zero else 45.0})
    return out


def bare(text: str) -> str:
    return re.sub(r"\s+", "", text)


def drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def legends(fig) -> list:
    return [leg for sub in fig.subfigs for leg in sub.legends]


def real_axes(fig) -> list:
    return [ax for ax in fig.get_axes() if ax.get_visible()]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("case", ["alone", "compared", "all_zero_compared"])
def test_every_legend_is_inside_the_figure_off_the_data_and_whole(case):
    a = rows([0.05, 0.10, 0.40])
    b = rows([0.0, 0.0, 0.0], zero=True) if case == "all_zero_compared" else rows([0.05, 0.02, 0.03])
    fig = figure(a, "addition_no_rationalization_seed_1", None if case == "alone" else b, LONG)
    renderer = drawn(fig)
    legs = legends(fig)
    assert len(legs) == (4 if case == "alone" else 6)  # one below every panel
    page = fig.bbox
    for leg in legs:
        box = leg.get_window_extent(renderer)
        assert page.x0 - 0.5 <= box.x0 and box.x1 <= page.x1 + 0.5, (box, page)  # inside the figure
        assert page.y0 - 0.5 <= box.y0 and box.y1 <= page.y1 + 0.5, (box, page)
        for ax in real_axes(fig):
            assert not box.overlaps(ax.get_window_extent(renderer)), "a legend sits on an axes' data"
            ticks = ax.xaxis.get_tightbbox(renderer)  # (None: a twin's hidden x axis)
            assert ticks is None or not box.overlaps(ticks), "a legend hides the iteration axis"
        for text in leg.get_texts():
            assert "…" not in text.get_text()  # wrapped, never cut
    shown = {bare(t.get_text()) for leg in legs for t in leg.get_texts()}  # whole, whatever the wrapping
    assert bare(f"{LONG}: train: solved among k") in shown or case == "alone"
    assert bare("addition_no_rationalization_seed_1: rationalized (right with the hint)") in shown


@pytest.mark.parametrize("dev", [[0.0], [0.0, 0.0, 0.0]], ids=["one_iteration", "three_iterations"])
def test_an_all_zero_run_has_sensible_axes(dev):
    fig = figure(rows(dev, zero=True), "zero", None, "")
    drawn(fig)
    iterations = range(len(dev))
    for ax in real_axes(fig):
        lo, hi = ax.get_ylim()
        assert lo == 0 and hi >= 1, (ax.get_title(), ax.get_ylabel(), lo, hi)  # no negative value, a real span
        for patch in ax.patches:
            assert patch.get_height() >= 0 and patch.get_y() >= 0  # no negative count
        x0, x1 = ax.get_xlim()
        assert x0 <= min(iterations) - 0.5 + 1e-9 and x1 >= max(iterations) + 0.5 - 1e-9  # not 0.945-1.05
        ticks = [t for t in ax.get_xticks() if x0 <= t <= x1]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # whole iterations only
        assert all(float(t).is_integer() for t in ax.get_yticks()) or ax.get_ylabel() != "examples"
    counts = next(ax for ax in real_axes(fig) if ax.get_ylabel() == "examples")
    assert counts.get_ylim() == (0, 1)


def test_the_kept_length_band_is_cut_at_zero():
    """A standard deviation above the mean would draw negative lengths."""
    fig = figure(rows([0.1, 0.2, 0.3]), "run", None, "")
    drawn(fig)
    ax = next(ax for ax in real_axes(fig) if ax.get_ylabel() == "tokens")
    (band,) = ax.collections
    ys = [y for path in band.get_paths() for _, y in path.vertices]
    assert min(ys) == 0 and max(ys) == pytest.approx(75)
    assert ax.get_ylim()[0] == 0


def test_a_long_label_is_wrapped_and_only_an_absurd_one_is_cut():
    text = "addition_no_rationalization_seed_1: rationalized (right with the hint)"
    assert bare(label(text)) == bare(text) and max(map(len, label(text).split("\n"))) <= 34
    assert label("1" * 5000).endswith("…") and label("1" * 5000).count("\n") == 2
    assert label("$x$") == r"\$x\$"


def test_accuracy_axes_stay_percentages():
    fig = figure(rows([0.5, 0.9]), "run", rows([0.01, 0.02]), "other")
    drawn(fig)
    by_title = {ax.get_title(): ax for ax in real_axes(fig)}
    assert by_title["run: dev accuracy"].get_ylim() == (0, 100)
    assert by_title["overall accuracy and coverage"].get_ylim() == (0, 100)  # 90 % among the values
    small = figure(rows([0.01, 0.02]), "run", rows([0.0, 0.01]), "other")  # coverage at most 10 %
    drawn(small)
    overlay = {ax.get_title(): ax for ax in real_axes(small)}["overall accuracy and coverage"]
    assert overlay.get_ylim() == (0, pytest.approx(11.5))  # a little above the largest value
    tiny = figure(rows([0.01, 0.02], zero=True), "run", rows([0.0, 0.01], zero=True), "other")
    drawn(tiny)
    overlay = {ax.get_title(): ax for ax in real_axes(tiny)}["overall accuracy and coverage"]
    assert overlay.get_ylim() == (0, 10)  # at least 10 %: 2 % is not drawn as a full-height curve
