"""End to end with the scripted model (``star_testkit``): an evaluation with
``[evaluation] checkers = ["math_verify", "gsm8k_strict", "gsm8k_flexible"]`` writes each verdict
per answer and each accuracy per class; a gold answer math-verify cannot parse is refused naming
the file and row, or skipped and counted; an answer past the time bound is wrong and counted.

The scripted model answers " 3 plus 4. The answer is 7." (right or off by 1..8): math-verify reads
"answer is 7", lm-eval's flexible rule the last number ("7."), its strict rule finds no "####".
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from star_testkit import TESTS, TOY_TOML

from star_engine.cli import main

CHECKERS = '\ncheckers = ["math_verify", "gsm8k_strict", "gsm8k_flexible"]'


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS",
                       "star_testkit.scripted,star_testkit.judges,star_mathverify.plugin,star_gsm8k.plugin")
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)


def experiment(tmp_path: Path, evaluation: str = CHECKERS, task: str = "", dev: list[str] | None = None) -> Path:
    text = TOY_TOML.format(out=(tmp_path / "run").as_posix()).replace("iterations = 3", "iterations = 1")
    text = text.replace('splits = ["dev"]', 'splits = ["dev"]' + evaluation)
    if dev is not None:
        (tmp_path / "train.txt").write_text("\n".join(f"{a}+{a + 3}" for a in range(1, 9)) + "\n")
        (tmp_path / "dev.txt").write_text("\n".join(dev) + "\n")
        text = text.replace('dataset = "toy"', 'dataset = "toy_gold"\ndata = { train = "train.txt", dev = "dev.txt" }')
    path = tmp_path / "toy.toml"
    path.write_text(text.replace('filters = ["toy_leak"]', 'filters = ["toy_leak"]' + task))
    return path


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def events(run: Path, name: str) -> list[dict]:
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == name]


def test_three_checkers_per_answer_and_per_class(plugins, tmp_path):
    assert main(["run", str(experiment(tmp_path)), "--quiet"]) == 0
    run = tmp_path / "run"
    answers = rows(run, "iterations/001/eval_dev.parquet") + rows(run, "iterations/000/eval_dev.parquet")
    assert len(answers) == 24 and 0 < sum(r["correct"] for r in answers) < 24
    for r in answers:
        v = {x["checker"]: x for x in r["verdicts"]}
        assert list(v) == ["math_verify", "gsm8k_strict", "gsm8k_flexible"]
        said = re.search(r"answer is (\d+)", r["generation"]).group(1)
        assert v["math_verify"] == {"checker": "math_verify", "predicted": said, "correct": r["correct"],
                                    "timed_out": False}
        assert v["gsm8k_flexible"] == {"checker": "gsm8k_flexible", "predicted": said + ".", "correct": r["correct"],
                                       "timed_out": False}
        assert v["gsm8k_strict"] == {"checker": "gsm8k_strict", "predicted": None, "correct": False,
                                     "timed_out": False}
    for m in (m for m in rows(run, "metrics.parquet") if m["split"] == "dev"):
        acc = {c["checker"]: c["accuracy"] for c in m["checkers"]}
        assert acc == {"math_verify": m["accuracy"], "gsm8k_strict": 0.0, "gsm8k_flexible": m["accuracy"]}
        assert all(c["n"] == m["n"] and c["timed_out"] == c["skipped"] == 0 for c in m["checkers"])
    report = (run / "report.md").read_text()
    assert "| iteration | toy_exact | math_verify | gsm8k_strict | gsm8k_flexible |" in report
    assert "dev accuracy (%) per class under gsm8k_flexible:" in report


def test_an_answer_past_the_bound_is_wrong_and_counted(plugins, tmp_path):
    """A gold answer of 10^{10^{10}}: math-verify parses it at once, but verifying any answer
    against it never ends (sympy computes the power); each such answer is cut at timeout_seconds."""
    evaluation = '\ncheckers = [{ name = "math_verify", timeout_seconds = 1.0 }]'
    path = experiment(tmp_path, evaluation, dev=["1+2", "3+4=10^{10^{10}}", "5+5"])
    t0 = time.perf_counter()
    assert main(["run", str(path), "--quiet"]) == 0
    assert time.perf_counter() - t0 < 120  # two answers cut at 1 s each, two restarts: no hang
    run = tmp_path / "run"
    for it in (0, 1):
        got = {r["question_id"]: r["verdicts"][0] for r in rows(run, f"iterations/{it:03d}/eval_dev.parquet")}
        assert got["dev-2"] == {"checker": "math_verify", "predicted": None, "correct": False, "timed_out": True}
        assert not got["dev-1"]["timed_out"] and not got["dev-3"]["timed_out"]
    (m,) = [m for m in rows(run, "metrics.parquet") if m["split"] == "dev" and m["class"] == "all" and m["iteration"]]
    assert [(c["n"], c["timed_out"]) for c in m["checkers"]] == [(3, 1)]
    counted = [(e["stage"], e["iteration"], e["checker"], e["count"]) for e in events(run, "checker_timeouts")]
    assert counted == [("evaluate", 0, "math_verify", 1), ("evaluate", 1, "math_verify", 1)]


DEV = ["1+2", "3+4=\\frac{1}{", "5+5"]


def test_a_gold_answer_that_does_not_parse_is_refused_naming_file_and_row(plugins, tmp_path, capsys):
    path = experiment(tmp_path, "", '\nchecker = "math_verify"', dev=DEV)
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert (f"{tmp_path / 'dev.txt'}: row 2 (question 'dev-2'): checker 'math_verify': gold answer "
                f"'\\\\frac{{1}}{{' does not parse: math-verify finds no answer in it (bad_gold = \"skip\" skips "
                f"such questions)") in err
    assert not (tmp_path / "run").exists()


def test_a_gold_answer_that_does_not_parse_is_skipped_and_counted(plugins, tmp_path):
    path = experiment(tmp_path, "", '\nchecker = { name = "math_verify", bad_gold = "skip" }', dev=DEV)
    assert main(["run", str(path), "--quiet"]) == 0
    run = tmp_path / "run"
    assert [r["question_id"] for r in rows(run, "iterations/001/eval_dev.parquet")] == ["dev-1", "dev-3"]
    (e,) = events(run, "gold_skipped")
    assert (e["checker"], e["split"], e["count"], e["question_ids"]) == ("math_verify", "dev", 1, ["dev-2"])
