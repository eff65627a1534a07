"""``star-engine compare RUN... --out DIR``: runs grouped by their settings (seeds together, as
mean ± sample standard deviation), on runs written here with known accuracies and on runs the
scripted backend makes; bad input is one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_engine.rundir.metrics import METRICS_SCHEMA


def make_run(path: Path, seed: int, temperature: float, dev: list[float], cls: dict[str, list[float]] | None = None):
    """A run directory: config.json (seed, temperature) and metrics.parquet (dev accuracy per
    iteration, its classes, and a train row per iteration >= 1)."""
    path.mkdir(parents=True)
    cfg = {"experiment": {"name": f"exp_{seed}", "seed": seed, "output_dir": str(path), "iterations": 2},
           "generation": {"temperature": temperature, "batch_size": 8}, "task": {"filters": ["a"]}}
    (path / "config.json").write_text(json.dumps(cfg))
    rows = []
    for n, acc in enumerate(dev):
        rows.append({"iteration": n, "split": "dev", "class": "all", "accuracy": acc, "n": 10})
        for c, values in (cls or {}).items():
            rows.append({"iteration": n, "split": "dev", "class": c, "accuracy": values[n], "n": 5})
        if n:
            rows.append({"iteration": n, "split": "train", "class": "all", "accuracy": acc / 2, "n": 10})
    pq.write_table(pa.Table.from_pylist(rows, schema=METRICS_SCHEMA), path / "metrics.parquet")
    return path


def pm(values: list[float]) -> str:
    pct = [100 * v for v in values]
    return f"{statistics.fmean(pct):.1f} ± {statistics.stdev(pct):.1f}"


@pytest.fixture
def runs(tmp_path):
    """Three seeds at temperature 0.5, two at 0.7 (one of which stopped an iteration early)."""
    r = tmp_path / "runs"
    a = [make_run(r / f"t05_seed{s}", s, 0.5, dev, {"1": c1, "10": c2}) for s, dev, c1, c2 in (
        (0, [0.1, 0.2, 0.3], [0.0, 0.1, 0.6], [0.2, 0.3, 0.0]),
        (1, [0.1, 0.4, 0.5], [0.0, 0.3, 0.8], [0.2, 0.5, 0.2]),
        (2, [0.1, 0.3, 0.7], [0.0, 0.2, 1.0], [0.2, 0.4, 0.4]))]
    b = [make_run(r / "t07_seed0", 0, 0.7, [0.1, 0.1, 0.2], {"1": [0.0, 0.1, 0.1], "10": [0.2, 0.1, 0.3]}),
         make_run(r / "t07_seed1", 1, 0.7, [0.1, 0.3], {"1": [0.0, 0.4], "10": [0.2, 0.2]})]
    return a, b


def test_seeds_are_grouped_as_mean_and_sample_sd(tmp_path, runs, capsys):
    a, b = runs
    out = tmp_path / "comparisons" / "t"
    assert main(["compare", str(tmp_path / "runs" / "t05_*"), *map(str, b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "compare.md").read_text()
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert md.startswith("# Comparison of 5 runs in 2 groups\n") and "![accuracy](compare.png)" in md
    # the groups, named by what differs between them, with their runs and seeds
    assert f"| generation.temperature=0.5 | {a[0]}, {a[1]}, {a[2]} | 0, 1, 2 |" in md
    assert f"| generation.temperature=0.7 | {b[0]}, {b[1]} | 0, 1 |" in md
    assert "| generation.temperature | 0.5 | 0.7 |" in md and "batch_size |" not in md  # only what differs
    assert "experiment.seed |" not in md and "experiment.name |" not in md
    # per iteration: mean ± sample sd; n given where fewer runs reached the iteration (t07_seed1 stopped at 1)
    assert f"| 1 | {pm([0.2, 0.4, 0.3])} | {pm([0.1, 0.3])} |" in md
    assert f"| 2 | {pm([0.3, 0.5, 0.7])} | 20.0 (n=1) |" in md
    assert "| 1 | 30.0 ± 10.0 | 20.0 ± 14.1 |" in md  # the same, by hand
    assert "## train accuracy (%) per iteration" in md and f"| 2 | {pm([0.15, 0.25, 0.35])} | 10.0 (n=1) |" in md
    # per class at the last iteration every run of the group reached: 2 for the first, 1 for the second
    assert "| class | generation.temperature=0.5 (n=3, iteration 2) | generation.temperature=0.7 (n=2, iteration 1) |" in md
    body = md.split("per class at the last iteration")[1]
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith(("| class", "| ---"))]
    assert rows == [f"| 1 | {pm([0.6, 0.8, 1.0])} | {pm([0.1, 0.4])} |",  # natural order: 1 before 10
                    f"| 10 | {pm([0.0, 0.2, 0.4])} | {pm([0.1, 0.2])} |",
                    f"| all | {pm([0.3, 0.5, 0.7])} | {pm([0.1, 0.3])} |"]
    # printed: the groups with their final accuracy, and the settings that differ
    assert "5 runs in 2 groups (mean ± sample standard deviation" in printed
    assert f"generation.temperature=0.5 (n=3, seeds 0, 1, 2): dev {pm([0.3, 0.5, 0.7])}% at iteration 2" in printed
    assert "settings that differ between the groups:\n  generation.temperature: 0.5 | 0.7\n" in printed
    assert printed.rstrip().endswith(f"wrote {out / 'compare.md'} and {out / 'compare.png'}")
    for run in (*a, *b):  # the runs are only read
        assert sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.parquet"]


def test_one_group_is_named_by_its_experiment_and_a_single_run_has_no_spread(tmp_path):
    run = make_run(tmp_path / "only", 3, 0.5, [0.25, 0.5])
    assert main(["compare", str(run), str(run), "--out", str(tmp_path / "c")]) == 0  # given twice: once
    md = (tmp_path / "c" / "compare.md").read_text()
    assert md.startswith("# Comparison of 1 run in 1 group\n") and "| exp_3 |" in md
    assert "| 1 | 50.0 |" in md and "±" not in md.split("## dev accuracy")[1]
    assert "Settings that differ" not in md


def test_seeds_of_scripted_runs_form_one_group(scripted, toy_toml, tmp_path, capsys):
    path = toy_toml()
    path.write_text(path.read_text().replace("iterations = 3", "iterations = 1"))
    assert main(["run", str(path), "--seeds", "4,5", "--quiet"]) == 0
    runs = [tmp_path / "run_seed4", tmp_path / "run_seed5"]
    before = {r: sorted(p.name for p in r.rglob("*")) for r in runs}
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "run_seed*"), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "2 runs in 1 groups" in out and "toy (n=2, seeds 4, 5): dev" in out
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| toy (n=2, iteration 1) |" in md.replace("| class | ", "| ")  # per class: the toy task's classes
    assert "## dev accuracy (%) per class at the last iteration" in md and "| all |" in md
    assert {r: sorted(p.name for p in r.rglob("*")) for r in runs} == before  # nothing written into the runs


@pytest.mark.parametrize("case", ["not_a_run", "missing", "no_match", "out_in_run", "out_is_run", "out_is_file",
                                  "no_runs", "a_file", "bad_config"])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, runs, capsys, case):
    a, _ = runs
    out = tmp_path / "out"
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("x")
    args = {"not_a_run": [str(tmp_path / "plain")], "missing": [str(tmp_path / "nope")],
            "no_match": [str(tmp_path / "runs" / "zz*")], "a_file": [str(tmp_path / "file.txt")],
            "no_runs": [], "out_in_run": [str(a[0]), "--out", str(a[0] / "cmp")],
            "out_is_run": [str(a[0]), "--out", str(a[1])], "out_is_file": [str(a[0]), "--out", str(tmp_path / "file.txt")],
            "bad_config": [str(a[1])]}[case]
    if case == "bad_config":
        (a[1] / "config.json").write_text("[1, 2]")
    if "--out" not in args:
        args += ["--out", str(out)]
    says = {"not_a_run": f"{tmp_path / 'plain'}: not a run directory (no config.json)",
            "missing": f"{tmp_path / 'nope'}: no such run directory", "no_match": "zz*: no run directory matches",
            "a_file": "file.txt: no such run directory", "no_runs": "the following arguments are required: RUN_DIR",
            "out_in_run": f"lies inside the run directory {a[0].resolve()}",
            "out_is_run": f"is the run directory {a[1].resolve()}", "out_is_file": "exists and is not a folder",
            "bad_config": "config.json: not a star-engine configuration"}[case]
    listing = sorted(str(p) for p in tmp_path.rglob("*"))
    try:
        code = main(["compare", *args])
    except SystemExit as e:  # argparse's usage error (no run given): the same rule
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == listing  # nothing written


def test_the_printed_compare_command_of_a_seeds_run_works(scripted, toy_toml, tmp_path, capsys, monkeypatch):
    path = toy_toml()
    path.write_text(path.read_text().replace("iterations = 3", "iterations = 1"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(path), "--seeds", "0,1"]) == 0
    line = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert line.startswith("see them together: star-engine compare ")
    argv = shlex.split(line.removeprefix("see them together: star-engine "))
    assert argv[-2:] == ["--out", "comparisons/toy"]
    assert main(argv) == 0
    assert (tmp_path / "comparisons" / "toy" / "compare.md").read_text().count("run_seed") == 2
