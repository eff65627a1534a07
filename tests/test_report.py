"""``star-engine report``: the plot and the Markdown summary, alone and with a second run overlaid."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from star_engine.cli import main
from star_engine.metrics import METRICS_SCHEMA


def _run(path, name, dev):
    """A run folder with config.json and metrics.parquet: dev accuracy per iteration (overall and
    two classes) and the train rows of iterations >= 1."""
    path.mkdir()
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
    assert main(["report", str(a), "--compare", str(b)]) == 0
    md = (a / "report.md").read_text()
    assert md.startswith("# STaR run: addition\n")  # the experiment's name, not the folder's
    assert "| 2 | 25.0% | 12.5% | 20 | 40 | 42 | 20.0% |" in md
    assert md.rstrip().endswith("Final dev accuracy: addition 25.0% vs addition_no_rationalization 3.0%")
    png = (a / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert not (b / "report.md").exists()  # the compared run is only read


def test_report_without_metrics_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no metrics.parquet" in capsys.readouterr().err
