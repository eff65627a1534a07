"""Several verdicts per evaluation (``[evaluation] checkers``) and the checkers' optional parts:
``Checker.check_gold`` (gold answers screened when the data is loaded: refused with the file and
row, or skipped and counted) and ``Verdict.timed_out`` (counted in the events and metrics).

The toy checkers are ``star_testkit.judges``: ``toy_gives_up`` gives up on every odd extraction,
``toy_digits`` screens gold answers that are not digits. The task's checker (``toy_exact``)
alone decides what is kept; the others' verdicts are recorded beside it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import TESTS
from star_engine.run import experiment
from star_engine.config import registry
from star_engine.cli import main
from star_engine.config.load import load_experiment

CHECKERS = '\ncheckers = ["toy_gives_up", { name = "toy_gives_up", rule = "last_digit" }, "toy_exact"]\n'
LABELS = ["toy_gives_up()", "toy_gives_up(rule='last_digit')", "toy_exact"]


@pytest.fixture
def judges(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_testkit.judges")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)


def toml(toy_toml, out: str, evaluation: str = "", task: str = "") -> Path:
    path = toy_toml(out, name=f"{out}.toml")
    text = path.read_text().replace("iterations = 3", "iterations = 1")
    text = text.replace('splits = ["dev"]', 'splits = ["dev"]' + evaluation)
    path.write_text(text.replace('filters = ["toy_leak"]', 'filters = ["toy_leak"]' + task))
    return path


def table(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def events(run: Path, name: str) -> list[dict]:
    lines = (run / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_each_checker_is_recorded_beside_the_task_checker_which_alone_decides(judges, toy_toml, tmp_path):
    base, multi = toml(toy_toml, "base"), toml(toy_toml, "multi", CHECKERS)
    assert main(["run", str(base), "--quiet"]) == 0 and main(["run", str(multi), "--quiet"]) == 0
    run = tmp_path / "multi"
    for rel in ("iterations/001/rationales.parquet", "iterations/001/eval_dev.parquet"):  # same verdicts, same kept
        strip = lambda rows: [{k: v for k, v in r.items() if k != "verdicts"} for r in rows]  # noqa: E731
        assert strip(table(run, rel)) == strip(table(tmp_path / "base", rel))
    assert [r["accuracy"] for r in table(run, "metrics.parquet")] == [
        r["accuracy"] for r in table(tmp_path / "base", "metrics.parquet")]

    tally: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])  # judged, right, timed out
    timeouts = defaultdict(int)
    for it in (0, 1):
        for r in table(run, f"iterations/{it:03d}/eval_dev.parquet"):
            got = {v["checker"]: v for v in r["verdicts"]}
            assert [v["checker"] for v in r["verdicts"]] == LABELS
            # the task's own checker (listed as "toy_exact"): its verdict, as the row's
            assert (got["toy_exact"]["correct"], got["toy_exact"]["predicted"]) == (r["correct"], r["predicted"])
            odd = r["predicted"] is not None and int(r["predicted"]) % 2 == 1
            assert got["toy_gives_up()"] == {"checker": "toy_gives_up()", "timed_out": odd,
                                              "predicted": None if odd else r["predicted"],
                                              "correct": r["correct"] and not odd}
            digit = re.findall(r"\d", r["generation"])[-1]
            assert got["toy_gives_up(rule='last_digit')"]["correct"] == r["gold"].endswith(digit)
            timeouts[it] += odd
            for label, v in got.items():
                for cls in ("all", r["class"]):
                    t = tally[(it, cls, label)]
                    t[0], t[1], t[2] = t[0] + 1, t[1] + v["correct"], t[2] + v["timed_out"]
    assert 0 < timeouts[0] < 12 and 0 < timeouts[1] < 12  # some answers given up on, not all

    dev_rows = [r for r in table(run, "metrics.parquet") if r["split"] == "dev"]
    assert {r["class"] for r in dev_rows} == {"all", "1", "2", "3"}
    for r in dev_rows:
        assert [c["checker"] for c in r["checkers"]] == LABELS
        for c in r["checkers"]:
            n, right, gave_up = tally[(r["iteration"], r["class"], c["checker"])]
            assert (c["n"], c["correct"], c["timed_out"], c["skipped"]) == (n, right, gave_up, 0)
            assert c["accuracy"] == pytest.approx(right / n)
        assert next(c for c in r["checkers"] if c["checker"] == "toy_exact")["accuracy"] == r["accuracy"]
    assert all(r["checkers"] == [] for r in table(run, "metrics.parquet") if r["split"] == "train")

    seen = {(e["iteration"], e["checker"]): e["count"] for e in events(run, "checker_timeouts")
            if e["stage"] == "evaluate"}
    assert seen == {(0, "toy_gives_up()"): timeouts[0], (1, "toy_gives_up()"): timeouts[1]}

    report = (run / "report.md").read_text()
    assert "| iteration | toy_exact | toy_gives_up() | toy_gives_up(rule='last_digit') | toy_exact |" in report
    assert f"({timeouts[0]} timed out)" in report
    for label in LABELS:
        assert f"dev accuracy (%) per class under {label}:" in report


CONFIG_ERRORS = [
    ('\ncheckers = ["toy_exact", "toy_gives_upp"]',
     "evaluation.checkers[1]: unknown checker 'toy_gives_upp'; available: toy_digits, toy_exact, toy_gives_up "
     "(did you mean 'toy_gives_up'"),
    ('\ncheckers = ["toy_gives_up", "toy_gives_up"]',
     "evaluation.checkers[1]: 'toy_gives_up()' is listed twice (evaluation.checkers[0]); list each checker once"),
    ('\ncheckers = [{ name = "toy_gives_up", rul = "last_digit" }]',
     "evaluation.checkers[0].rul: unknown option for checker 'toy_gives_up'; accepted: rule (did you mean 'rule'?)"),
    ('\ncheckers = [{ name = "toy_gives_up", rule = "first" }]',
     "evaluation.checkers[0].rule: must be one of"),
    ('\ncheckers = "toy_exact"', "evaluation.checkers: expected a list of names or tables with 'name'"),
    ('\ncheckers = [{ rule = "x" }]', "evaluation.checkers: expected a list of names or tables with 'name'"),
]


@pytest.mark.parametrize("evaluation,expected", CONFIG_ERRORS)
def test_bad_checker_lists_are_one_line_errors_naming_the_key(judges, toy_toml, tmp_path, capsys, evaluation,
                                                              expected):
    path = toml(toy_toml, "run", evaluation)
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def data(tmp_path: Path, train: list[str], dev: list[str]) -> str:
    for split, lines in (("train", train), ("dev", dev)):
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return '\ndata = { train = "train.txt", dev = "dev.txt" }'


TRAIN = ["1+2", "3+4", "5+6=eleven", "7+8", "2+2"]
DEV = ["1+1", "2+3=5", "4+4=eight", "6+1"]


@pytest.mark.parametrize("where", ["task", "evaluation"])
def test_a_gold_answer_a_checker_refuses_stops_the_command_naming_file_and_row(judges, toy_toml, tmp_path,
                                                                               capsys, where):
    task = '\ndataset = "toy_gold"' + data(tmp_path, TRAIN, DEV)
    if where == "task":
        task += '\nchecker = "toy_digits"'
        expected = f"{tmp_path / 'train.txt'}: row 3 (question 'train-3'): checker 'toy_digits': gold answer " \
                   f"'eleven' is not digits"
        evaluation = ""
    else:  # an evaluation checker screens the evaluated splits only: train's "eleven" is no concern of it
        expected = f"{tmp_path / 'dev.txt'}: row 3 (question 'dev-3'): checker 'toy_digits': gold answer " \
                   f"'eight' is not digits"
        evaluation = '\ncheckers = ["toy_digits"]'
    path = toml(toy_toml, "run", evaluation, task.replace('\ndataset = "toy_gold"', ""))
    path.write_text(path.read_text().replace('dataset = "toy"', 'dataset = "toy_gold"'))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()  # nothing written


def test_skipped_gold_answers_are_left_out_or_unjudged_and_counted(judges, toy_toml, tmp_path):
    task = data(tmp_path, TRAIN, DEV) + '\nchecker = { name = "toy_digits", bad_gold = "skip" }'
    path = toml(toy_toml, "run", '\ncheckers = [{ name = "toy_digits", bad_gold = "skip" }, "toy_gives_up"]', task)
    path.write_text(path.read_text().replace('dataset = "toy"', 'dataset = "toy_gold"'))
    # The task's checker and the identical evaluation entry are one checker: each gold screened once.
    reg = registry.Registry()
    exp = experiment.build(load_experiment(path, registry=reg), reg)
    assert exp.panel.entries[0].is_task_checker and exp.panel.entries[0].checker is exp.checker
    assert sorted(exp.checker.calls) == sorted(["3", "7", "eleven", "15", "4", "2", "5", "eight", "7"])
    assert [e.id for e in exp.splits["train"]] == ["train-1", "train-2", "train-4", "train-5"]
    assert [e.id for e in exp.splits["dev"]] == ["dev-1", "dev-2", "dev-4"]  # the task's checker skips dev-3 too

    assert main(["run", str(path), "--quiet"]) == 0
    run = tmp_path / "run"
    assert {r["question_id"] for r in table(run, "iterations/001/generated.parquet")} == {
        "train-1", "train-2", "train-4", "train-5"}
    skipped = {(e["checker"], e["split"]): (e["count"], e["question_ids"]) for e in events(run, "gold_skipped")}
    assert skipped == {("toy_digits", "train"): (1, ["train-3"]), ("toy_digits", "dev"): (1, ["dev-3"])}


def test_an_evaluation_checker_leaves_the_questions_it_skips_unjudged(judges, toy_toml, tmp_path):
    task = data(tmp_path, TRAIN, DEV)
    path = toml(toy_toml, "run", '\ncheckers = [{ name = "toy_digits", bad_gold = "skip" }]', task)
    path.write_text(path.read_text().replace('dataset = "toy"', 'dataset = "toy_gold"'))
    assert main(["run", str(path), "--quiet"]) == 0
    run = tmp_path / "run"
    rows = table(run, "iterations/001/eval_dev.parquet")
    assert [r["question_id"] for r in rows] == ["dev-1", "dev-2", "dev-3", "dev-4"]  # the task judges all four
    (unjudged,) = [r for r in rows if r["question_id"] == "dev-3"]
    assert unjudged["verdicts"] == [{"checker": "toy_digits", "predicted": None, "correct": None, "timed_out": False}]
    (row,) = [r for r in table(run, "metrics.parquet") if r["split"] == "dev" and r["class"] == "all"
              and r["iteration"] == 1]
    (c,) = row["checkers"]
    judged = [r for r in rows if r["question_id"] != "dev-3"]
    assert (c["n"], c["skipped"], c["correct"]) == (3, 1, sum(r["verdicts"][0]["correct"] for r in judged))
    assert row["n"] == 4
    skipped = [(e["checker"], e["split"], e["count"]) for e in events(run, "gold_skipped")]
    assert skipped == [("toy_digits", "dev", 1)]  # it judges no train question: train's "eleven" is not counted


def test_a_run_directory_written_before_the_key_resumes(judges, toy_toml, tmp_path):
    path = toml(toy_toml, "run")
    assert main(["run", str(path), "--quiet"]) == 0
    cfg_file = tmp_path / "run" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    assert cfg["evaluation"]["checkers"] == []
    del cfg["evaluation"]["checkers"]
    cfg_file.write_text(json.dumps(cfg))
    assert main(["run", str(path), "--quiet"]) == 0
    changed = toml(toy_toml, "run", '\ncheckers = ["toy_gives_up"]')
    assert main(["run", str(changed), "--quiet"]) == 2  # adding checkers to a run is a change of configuration
