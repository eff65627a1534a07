"""``star-engine show RUN_DIR`` on runs of the toy experiment made here (the scripted backend): every
rationale and evaluation answer the files hold, with every column (jsonl, csv), the filters against
the same selection made on the Parquet files, the question's history from the ledger, a run stopped
before its selection, a file written before the evaluation recorded its question, bad filters."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_engine.report.show import columns
from star_testkit import TOY_TOML, cli, scripted_env, scripted_plugin_examples
from star_testkit.scripted import ToyTask


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished toy run (3 iterations, 2 sampled answers per dev question besides the greedy one)."""
    base = tmp_path_factory.mktemp("show")
    toml = base / "toy.toml"
    toml.write_text(TOY_TOML.format(out=(base / "run").as_posix()))
    res = cli("run", str(toml), "--quiet", "--set", "evaluation.samples_per_question=2",
              "--set", "evaluation.sample_temperature=0.7")
    assert res.returncode == 0, res.stderr
    return base / "run"


def parquet(root: Path, pattern: str) -> list[dict]:
    """The rows of the run's files whose path (relative) matches ``pattern``, by iteration."""
    files = sorted(p for p in root.rglob("*.parquet") if re.fullmatch(pattern, p.relative_to(root).as_posix()))
    return [r for p in files for r in pq.read_table(p).to_pylist()]


def show(capsys, root: Path, *args: str) -> str:
    assert main(["show", str(root), *args]) == 0
    return capsys.readouterr().out


def jsonl(capsys, root: Path, *args: str) -> list[dict]:
    return [json.loads(line) for line in show(capsys, root, *args, "--format", "jsonl").splitlines()]


def test_jsonl_holds_every_rationale_and_answer_with_every_column(run, capsys):
    rows = jsonl(capsys, run)
    rationales = parquet(run, r"iterations/\d+/rationales\.parquet")
    greedy = parquet(run, r"iterations/\d+/eval_dev\.parquet")
    sampled = parquet(run, r"iterations/\d+/eval_dev_samples\.parquet")
    assert greedy and sampled and rationales
    assert len(rows) == len(rationales) + len(greedy) + len(sampled)
    assert all(tuple(r) == columns() for r in rows)
    shown = {(r["iteration"], r["kind"], r["question_id"], r["sample"]): r for r in rows}
    for r in rationales:
        kind = "rationalized" if r["was_hinted"] else "rationale"
        got = shown[(r["iteration"], kind, r["question_id"], r["sample"])]
        assert got["split"] == "train" and got["question"] == r["prompt"] and got["text"] == r["rationale"]
        assert {k: got[k] for k in r if k not in ("prompt", "rationale")} == {k: v for k, v in r.items()
                                                                            if k not in ("prompt", "rationale")}
    dev = {ex.id: ToyTask().context(ex) for ex in scripted_plugin_examples("dev")}
    for r, kind in [(r, "greedy") for r in greedy] + [(r, "sampled") for r in sampled]:
        got = shown[(r["iteration"], kind, r["question_id"], r.get("sample"))]
        assert got["question"] == r["question"] == dev[r["question_id"]]  # the question the model was asked
        assert got["text"] == r["generation"] and got["kept"] is None
        assert {k: got[k] for k in r if k != "generation"} == {k: v for k, v in r.items() if k != "generation"}


def test_csv_holds_the_same_rows_as_jsonl(run, capsys):
    want = jsonl(capsys, run, "--iteration", "1")
    got = list(csv.reader(io.StringIO(show(capsys, run, "--iteration", "1", "--format", "csv"))))
    assert tuple(got[0]) == columns() and len(got) == len(want) + 1
    cell = lambda v: "" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)  # noqa: E731
    assert got[1:] == [[cell(r[c]) for c in columns()] for r in want]


def test_the_filters_select_what_the_files_say(run, capsys):
    rationales = parquet(run, r"iterations/\d+/rationales\.parquet")
    want = [(r["iteration"], r["question_id"], r["sample"]) for r in rationales
            if r["iteration"] == 2 and not r["correct"] and r["class"] == "1"]
    got = jsonl(capsys, run, "--split", "train", "--iteration", "2", "--wrong", "--class", "1")
    assert want and [(r["iteration"], r["question_id"], r["sample"]) for r in got] == want
    hinted = jsonl(capsys, run, "--rationalized")
    assert len(hinted) == sum(r["was_hinted"] for r in rationales) > 0
    assert {r["kind"] for r in hinted} == {"rationalized"} and all(r["was_hinted"] for r in hinted)
    dev = jsonl(capsys, run, "--split", "dev")
    assert {r["kind"] for r in dev} == {"greedy", "sampled"} and {r["split"] for r in dev} == {"dev"}
    assert len(dev) == len(parquet(run, r"iterations/\d+/eval_dev(_samples)?\.parquet"))
    grep = jsonl(capsys, run, "--grep", r"^ 7 plus")
    assert grep and all(r["text"].startswith(" 7 plus") or r["question"].startswith(" 7 plus") for r in grep)
    assert len(grep) == sum(r["rationale"].startswith(" 7 plus") for r in rationales) + sum(
        r["generation"].startswith(" 7 plus") for r in parquet(run, r"iterations/\d+/eval_dev(_samples)?\.parquet"))
    assert jsonl(capsys, run, "--limit", "3") == jsonl(capsys, run)[:3]


def test_the_table_shows_the_verdict_and_what_rejected_a_rationale(run, capsys):
    rejected = [r for r in parquet(run, r"iterations/\d+/rationales\.parquet") if r["rejected_by"] == "toy_leak"]
    assert rejected
    r = rejected[0]
    out = show(capsys, run, "--iteration", str(r["iteration"]), "--question", r["question_id"], "--rationalized")
    n = sum(x["was_hinted"] for x in parquet(run, rf"iterations/{r['iteration']:03d}/rationales\.parquet")
            if x["question_id"] == r["question_id"])
    assert out.startswith(f"{run}: {n} rows\n")
    assert "rejected: toy_leak" in out and r["prompt"].splitlines()[0] in out and r["rationale"].strip() in out
    assert "right" in out  # the checker accepted it; the filter rejected it
    out = show(capsys, run, "--limit", "2")
    assert f"{run}: 2 of {len(jsonl(capsys, run))} rows (--limit)" in out


def test_a_question_comes_with_its_history_from_the_ledger(run, capsys):
    ledger = [q for q in pq.read_table(run / "questions.parquet").to_pylist() if q["question_id"] == "train-3"]
    assert len(ledger) == 3
    out = show(capsys, run, "--question", "train-3")
    history = out.split("question train-3 across iterations (questions.parquet):\n", 1)[1]
    for q in ledger:
        cells = [q[c] for c in ("iteration", "samples", "correct", "hinted_samples", "hinted_correct", "kept")]
        assert re.search(r"│\s+" + r"\s+│\s+".join(map(str, cells)) + r"\s+│", history), (cells, history)
    rows = jsonl(capsys, run, "--question", "train-3")
    assert rows and {r["question_id"] for r in rows} == {"train-3"}
    out = show(capsys, run, "--question", "dev-0")  # an evaluation question: no ledger rows
    assert "question dev-0: no row in questions.parquet" in out


def test_a_run_stopped_before_its_selection_shows_its_rationales_undecided(tmp_path, capsys):
    toml = tmp_path / "toy.toml"
    toml.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()))
    res = cli("run", str(toml), "--quiet", env=scripted_env(SCRIPTED_KILL="generate:45"))  # in iteration 1's rationalize
    assert res.returncode == -9
    rows = jsonl(capsys, tmp_path / "run", "--iteration", "1")
    generated = pq.read_table(tmp_path / "run/iterations/001/generated.parquet").to_pylist()
    assert len(rows) == len(generated) and all(r["kept"] is None and r["rejected_by"] is None for r in rows)
    assert "not selected yet" in show(capsys, tmp_path / "run", "--iteration", "1", "--limit", "1")


def test_an_evaluation_file_written_before_the_question_was_recorded_shows_none(run, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(run, old)
    path = old / "iterations/001/eval_dev.parquet"
    pq.write_table(pq.read_table(path).drop(["question"]), path)
    rows = jsonl(capsys, old, "--iteration", "1", "--split", "dev")
    assert {r["question"] for r in rows if r["kind"] == "greedy"} == {None}
    assert {r["question"] is not None for r in rows if r["kind"] == "sampled"} == {True}
    assert "│ –" in show(capsys, old, "--iteration", "1", "--split", "dev", "--limit", "1")


@pytest.mark.parametrize("args, message", [
    (["--iteration", "9"], "--iteration 9: no such iteration in {run} (it has iterations 0-3)"),
    (["--split", "test"], "--split test: no such split in {run} (it has train, dev: "),
    (["--class", "7"], "--class 7: no such class among the rows of {run} (classes: 1, 2, 3)"),
    (["--question", "nope"], "--question nope: no such question among the rows of {run}"),
    (["--grep", "("], "--grep '(': not a regular expression ("),
    (["--limit", "0"], "--limit 0: must be >= 1"),
])
def test_a_filter_naming_what_the_run_lacks_is_one_line_and_exit_2(run, capsys, args, message):
    assert main(["show", str(run), *args]) == 2
    res = capsys.readouterr()
    assert res.out == "" and res.err.count("\n") == 1, res
    assert res.err.startswith("error: " + message.format(run=run)), res.err
