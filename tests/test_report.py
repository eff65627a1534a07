"""``star-engine report``: the plot and the Markdown summary, alone and with a second run overlaid."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_engine.rundir.metrics import METRICS_SCHEMA


def _run(path, name, dev):
    """A run folder with config.json and metrics.parquet: dev accuracy per iteration (overall and
    two classes) and the train rows of iterations >= 1."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"experiment": {"name": name}}))
    rows = []
    for n, acc in enumerate(dev):
        for cls, a in (("all", acc), ("1", min(1.0, 2 * acc)), ("2", acc / 2)):
            rows.append({"iteration": n, "split": "dev", "class": cls, "accuracy": a, "n": 100})
        if n:
            rows.append({"iteration": n, "split": "train", "class": "all", "accuracy": acc / 2, "n": 50,
                         "rationalized": 10 * n, "kept": 20 * n, "train_steps": 40 + n, "coverage": 0.1 * n})
    pq.write_table(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), path / "metrics.parquet")
    return path


def test_report_with_a_second_run_overlaid(tmp_path, capsys):
    a = _run(tmp_path / "a", "addition", [0.05, 0.10, 0.25])
    b = _run(tmp_path / "b", "addition_no_rationalization", [0.05, 0.02, 0.03])
    assert main(["report", str(a)]) == 0
    own = (a / "report.md").read_bytes(), (a / "report.png").read_bytes()
    assert main(["report", str(a), "--compare", str(b)]) == 0
    # changed deliberately (issue #43): --compare writes report_vs_<other>.md/.png and leaves the run's own report
    assert ((a / "report.md").read_bytes(), (a / "report.png").read_bytes()) == own
    assert "deprecated" in capsys.readouterr().err
    md = (a / "report_vs_b.md").read_text()
    assert md.startswith("# STaR run: addition\n")  # the experiment's name, not the folder's
    assert "![accuracy](report_vs_b.png)" in md
    # each run labelled by its directory, and the labels explained
    assert (f"Runs: **a** is {a} (experiment addition); **b** is {b} (experiment addition_no_rationalization)."
            in md)
    assert "| 2 | 25.0% | 12.5% | 20 | 40 | 42 | 20.0% |" in md
    assert md.rstrip().endswith("Final dev accuracy: a 25.0% vs b 3.0%")
    png = (a / "report_vs_b.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000 and png != own[1]
    assert sorted(p.name for p in b.iterdir()) == ["config.json", "metrics.parquet"]  # the compared run is only read


def test_report_without_metrics_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no metrics.parquet" in capsys.readouterr().err


# ------------------------------------------------------------------ hostile metrics files: one line, exit 2


def _damaged(tmp_path, kind: str):
    run = _run(tmp_path / kind, "x", [0.1, 0.2, 0.3])
    path = run / "metrics.parquet"
    data = bytearray(path.read_bytes())
    if kind == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif kind == "bit_flipped_footer":
        data[-20] ^= 0x55  # inside the footer's metadata
        path.write_bytes(bytes(data))
    elif kind == "foreign":
        pq.write_table(pa.table({"x": [1, 2], "y": ["a", "b"]}), path)
    elif kind == "wrong_types":
        pq.write_table(pa.table({f.name: pa.array(["?"] * 2) for f in METRICS_SCHEMA}), path)
    elif kind == "null_split":
        rows = [{"iteration": 0, "split": None, "class": "all", "accuracy": 0.5}]
        pq.write_table(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), path)
    elif kind == "infinite_accuracy":
        rows = [{"iteration": 0, "split": "dev", "class": "all", "accuracy": float("inf")}]
        pq.write_table(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), path)
    elif kind == "not_parquet":
        path.write_text('{"iteration": 0}\n')
    elif kind == "a_folder":
        path.unlink()
        path.mkdir()
    return run


@pytest.mark.parametrize("kind", ["truncated", "bit_flipped_footer", "foreign", "wrong_types", "null_split",
                                  "infinite_accuracy", "not_parquet", "a_folder"])
def test_report_on_a_damaged_or_foreign_metrics_file_is_one_line(tmp_path, capsys, kind):
    run = _damaged(tmp_path, kind)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run / 'metrics.parquet'}") and err.count("\n") == 1, err
    assert not (run / "report.md").exists() and not (run / "report.png").exists()
    other = _run(tmp_path / f"good_{kind}", "good", [0.1, 0.2])
    assert main(["report", str(other), "--compare", str(run)]) == 2  # as the compared run too
    assert capsys.readouterr().err.startswith(f"error: {run / 'metrics.parquet'}")


def test_report_refuses_a_metrics_file_declaring_too_much(tmp_path, capsys, monkeypatch):
    import star_engine.report.report as report

    run = _run(tmp_path / "big", "x", [0.1, 0.2, 0.3])
    monkeypatch.setattr(report, "MAX_ROWS", 5)  # the footer says 11 rows: refused before reading them
    assert main(["report", str(run)]) == 2
    assert "11 rows" in capsys.readouterr().err


def test_report_plots_numeric_and_other_classes(tmp_path):
    run = _run(tmp_path / "classes", "x", [0.1, 0.2])
    rows = pq.read_table(run / "metrics.parquet").to_pylist()
    rows += [{**rows[0], "class": c} for c in ("²", "1" * 5000, "10", "b", "$\\frac{$", "$x$")]  # odd names
    pq.write_table(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), run / "metrics.parquet")
    assert main(["report", str(run)]) == 0


def test_report_shows_every_class_of_both_runs_and_reads_them(tmp_path):
    from star_engine.report.plot import figure
    from star_engine.report.report import markdown, read_metrics

    a = read_metrics(_run(tmp_path / "a", "addition", [0.05, 0.10, 0.40]))
    b = read_metrics(_run(tmp_path / "b", "addition_no_rationalization", [0.05, 0.02, 0.03]))
    fig = figure(a, "addition", b, "addition_no_rationalization")
    acc_a, acc_b, counts = fig.axes[:3]
    for ax, ys in ((acc_a, {"1": [10, 20, 80], "2": [2.5, 5, 20], "all": [5, 10, 40]}),
                   (acc_b, {"1": [10, 4, 6], "2": [2.5, 1, 1.5], "all": [5, 2, 3]})):
        lines = {ln.get_label(): [round(float(v), 6) for v in ln.get_ydata()] for ln in ax.get_lines()}
        assert lines == ys  # every class of each run, in its own panel
    assert [round(p.get_height()) for p in counts.patches] == [20, 40, 10, 20, 20, 40]  # kept, rationalized, b's kept
    md = markdown(a, "addition", b, "addition_no_rationalization")
    assert ("addition: dev accuracy went from 5.0% at iteration 0 to 40.0% at iteration 2 (+35.0 points). "
            "Per class: 1 10→80, 2 2→20. Every class ended above its start. First at 50% or more: 1 at iteration 2. "
            "The fine-tuning set held 20, 40 examples in iterations 1–2; 10, 20 rationales were right only with "
            "the hint (rationalized, before the filters). addition_no_rationalization ended at 3.0%, 37.0 points below addition.") in md
    assert "| iteration | 1 | 2 | all |" in md and "| 2 | 80.0 | 20.0 | 40.0 |" in md
    assert "| 1 | 4.0 | 1.0 | 2.0 |" in md  # the compared run's table too
    md_b = markdown(b, "addition_no_rationalization", None, "")
    assert "Not above its start: 1, 2." in md_b and "First at 50%" not in md_b


# ------------------------------------------------------------------ the command: labels and what it prints


def test_two_runs_of_one_experiment_are_labelled_by_their_directories(tmp_path):
    """``report --compare`` of two runs of the same file (one experiment name): as a process, it
    prints the summary table and the reading, each run named by its run directory."""
    from star_testkit import cli

    a = _run(tmp_path / "seed1" / "run", "addition", [0.05, 0.10, 0.25])
    b = _run(tmp_path / "seed2" / "run", "addition", [0.05, 0.02, 0.03])
    res = cli("report", str(a), "--compare", str(b))
    # changed deliberately (issue #43): one line on stderr says --compare is deprecated
    assert res.returncode == 0 and res.stderr.count("\n") == 1 and "star-engine compare" in res.stderr, res.stderr
    out = res.stdout
    assert "STaR run summary" in out and "rationalized" in out and "…" not in out  # the table, whole (a pipe)
    assert ("seed1/run: dev accuracy went from 5.0% at iteration 0 to 25.0% at iteration 2 (+20.0 points)." in out
            and "seed2/run ended at 3.0%, 22.0 points below seed1/run." in out)
    assert out.rstrip().endswith(f"wrote {a / 'report_vs_seed2-run.md'} and {a / 'report_vs_seed2-run.png'}")
    assert not (a / "report.md").exists()  # the run's own report is not the comparison
    md = (a / "report_vs_seed2-run.md").read_text()
    assert md.startswith("# STaR run: addition\n") and "**seed1/run** is" in md and "**seed2/run** is" in md
    assert "seed2/run, dev accuracy (%) per class:" in md and "addition ended" not in md


def test_labels_given_on_the_command_line(tmp_path, capsys):
    a = _run(tmp_path / "a", "addition", [0.05, 0.10, 0.25])
    b = _run(tmp_path / "b", "addition", [0.05, 0.10, 0.25])
    assert main(["report", str(a), "--compare", str(b), "--label", "with hint", "--label", "without"]) == 0
    out = capsys.readouterr().out
    assert "without ended at 25.0%, the same as with hint." in out
    assert main(["report", str(a), "--compare", str(b), "--label", "first"]) == 0  # b: its directory
    assert "b ended at 25.0%, the same as first." in capsys.readouterr().out
    assert main(["report", str(a), "--label", "alone"]) == 0
    assert (a / "report.md").read_text().startswith("# STaR run: addition\n") and "alone: dev accuracy" in \
        capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--label", "x", "--label", "y"], "--label: given 2 times; once for RUN_DIR (twice only with --compare)"),
    (["--compare", "{b}", "--label", "x", "--label", "y", "--label", "z"],
     "--label: given 3 times; once for RUN_DIR and once for the --compare run"),
    (["--compare", "{b}", "--label", "same", "--label", "same"],
     "--label: both runs would be labelled 'same'; give each its own label"),
    (["--compare", "{b}", "--label", "b"], "--label: both runs would be labelled 'b'; give each its own label"),
    (["--label", " "], "--label: must not be empty"),
    (["--compare", "{a}"], "--compare: {a} is the run directory being reported; compare it with another run"),
])
def test_bad_labels_are_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    a = _run(tmp_path / "a", "addition", [0.05, 0.10])
    b = _run(tmp_path / "b", "addition", [0.05, 0.10])
    args = [x.format(a=a, b=b) for x in args]
    assert main(["report", str(a), *args]) == 2
    assert capsys.readouterr().err == f"error: {message.format(a=a)}\n"
    assert not (a / "report.md").exists() and not (a / "report.png").exists()


def test_directory_labels_keep_the_names_given(tmp_path):
    from star_engine.errors import UserError
    from star_engine.report.report import directory_labels

    a = _run(tmp_path / "runs" / "a" / "run", "addition", [0.1])
    b = _run(tmp_path / "runs" / "b" / "run", "addition", [0.1])
    assert directory_labels(a, b) == ("a/run", "b/run")
    (tmp_path / "latest").symlink_to(b)
    assert directory_labels(a, tmp_path / "latest") == ("run", "latest")  # the link's name, not its target's
    (tmp_path / "same").symlink_to(a)
    with pytest.raises(UserError, match="is the run directory being reported"):
        directory_labels(a, tmp_path / "same")
