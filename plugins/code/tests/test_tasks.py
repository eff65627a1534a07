"""The code tasks as the core loads them: HumanEval and MBPP layouts (fixtures written here), the
generated code_expr task, their gold completions judged right by python_tests and wrong against
another question's tests, bad data and bad options refused in one line naming file:line or the key
(exit 2, nothing written), and the shipped experiments validating with the tiny override."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from star_code.checker import PythonTestsChecker
from star_code.expr import CodeExprTask
from star_code.task import CodeTask, TestsHint

DATA = Path(__file__).parent / "data"
HE, MBPP = DATA / "humaneval_sample.jsonl", DATA / "mbpp_sample.jsonl"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def checker():
    return PythonTestsChecker(timeout_seconds=3.0)


def judged(task, checker, examples):
    for i, ex in enumerate(examples):
        other = examples[(i + 1) % len(examples)]
        done = task.gold_completion(ex, False)
        for s in task.stop:
            done = done.split(s)[0]  # what a generation keeps: cut before the first stop string
        assert checker.check_gold(ex.answer)
        assert checker.check(done, task.extract(done), ex.answer).correct, ex.id
        assert not checker.check(done, task.extract(done), other.answer).correct, (ex.id, other.id)


def test_humaneval_layout(checker):
    task = CodeTask(layout="humaneval", n_shots=2, class_by="source")
    examples = task.load("test", str(HE))
    assert [ex.id for ex in examples] == ["Sample/0", "Sample/1", "Sample/2"] and {ex.cls for ex in examples} == {"humaneval"}
    assert task.context(examples[0]).startswith("def double") and task.stop == ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
    assert task.prompt("rationale").startswith("def add") and task.prompt("rationale").endswith("\n\n")
    judged(task, checker, examples)
    hinted = TestsHint().context(task, examples[0])
    assert hinted.startswith("# Tests it must pass:\n# def check(candidate):") and hinted.endswith(examples[0].question)


def test_mbpp_layout_splits_by_task_id(checker):
    task = CodeTask(layout="mbpp", n_shots=1)
    train, test = task.load("train", str(MBPP)), task.load("test", str(MBPP))
    assert [ex.id for ex in train] == ["601", "602", "603"] and [ex.id for ex in test] == ["11", "12"]
    ctx = task.context(train[0])
    assert ctx.startswith("You are an expert Python programmer, and here is your task: Write a function to find")
    assert ctx.endswith("assert biggest([3, 3]) == 3\n[BEGIN]\n") and task.stop == ("[DONE]",)
    assert task.gold_completion(train[0], False) == "def biggest(xs):\n    return max(xs)\n[DONE]"
    judged(task, checker, train + test)  # 603 needs its test_setup_code (import math)
    every = CodeTask(layout="mbpp", mbpp_split_by_id=False, class_by="field", class_field="task_id")
    assert [ex.cls for ex in every.load("train", str(MBPP))] == ["11", "12", "601", "602", "603"]


def test_code_expr_generates_right_gold_programs_and_disjoint_splits(checker):
    task = CodeExprTask(n_train=40, n_dev=20, n_seed=10)
    train, dev = task.load("train", None), task.load("dev", None)
    assert not {ex.id for ex in train} & {ex.id for ex in dev} and len(train) == 40
    assert {ex.cls for ex in train} <= {"map", "order", "reduce", "slice"}
    judged(task, checker, dev[:8])
    assert CodeExprTask(n_train=40, n_dev=20, n_seed=10).load("dev", None) == dev  # deterministic
    assert len(task.seed_examples()) == 10 and task.seed_examples()[0].completion.endswith("\n")


def rows(tmp_path, layout, mutate):
    src = HE if layout == "humaneval" else MBPP
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    mutate(lines[1])
    path = tmp_path / f"{layout}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.mark.parametrize("layout, mutate, message", [
    ("humaneval", lambda r: r.pop("test"), "humaneval.jsonl:2: missing field 'test'"),
    ("humaneval", lambda r: r.update(test="def check(c):\n    assert c(1) ==\n"), "humaneval.jsonl:2: field 'test' does not parse as Python"),
    ("mbpp", lambda r: r.update(test_list=[]), "mbpp.jsonl:2: field 'test_list' is empty"),
    ("mbpp", lambda r: r.update(test_list=["assert rev('a') = 'a'"]), "mbpp.jsonl:2: field 'test_list[0]' does not parse"),
])
def test_bad_data_is_one_line_naming_file_and_line(star, tmp_path, layout, mutate, message):
    path = rows(tmp_path, layout, mutate)
    toml = tmp_path / "exp.toml"
    toml.write_text((ROOT / "experiments" / ("humaneval.toml" if layout == "humaneval" else "mbpp_star.toml")).read_text()
                    .replace('data_root = "../../shared/data"', f'data_root = "{tmp_path}"'))
    data = f'task.data={{train = "{path}", test = "{path}"}}'
    code, err = star("validate", str(toml), "--smoke", "--set", data, "--set", f'experiment.output_dir="{tmp_path}/run"')
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, message", [
    ("timeout_seconds = 0", "task.checker.timeout_seconds: must be > 0, got 0"),
    ("memory_mb = 0", "task.checker.memory_mb: must be >= 64, got 0"),
    ("processes = 0", "task.checker.processes: must be >= 1, got 0"),
    ("timeout_seconds = 100000", "task.checker.timeout_seconds: at most 600"),
    ("memory_mb = 10000000", "task.checker.memory_mb: at most 65536"),
    (f"workers = {len(os.sched_getaffinity(0)) + 1}", "task.checker.workers: at most the"),
    ('isolation = "vm"', "task.checker.isolation: must be one of auto, namespaces, process"),
])
def test_bad_checker_options_are_one_line_naming_the_key(star, tmp_path, option, message):
    toml = tmp_path / "exp.toml"
    toml.write_text((ROOT / "experiments" / "code_expr.toml").read_text().replace(
        'checker = { name = "python_tests", timeout_seconds = 2.0, memory_mb = 512, workers = 1 }',
        f'checker = {{ name = "python_tests", {option} }}').replace('output_dir = "../runs/code_expr"',
                                                                  f'output_dir = "{tmp_path}/run"'))
    code, err = star("validate", str(toml))
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, fixture", [("humaneval", HE), ("mbpp_star", MBPP), ("code_expr", None)])
def test_the_shipped_experiments_validate_with_the_tiny_override(star, name, fixture):
    extra = ["--set", f'task.data={{train = "{fixture}", test = "{fixture}"}}'] if fixture else []
    code, err = star("validate", str(ROOT / "experiments" / f"{name}.toml"), "--smoke", *extra)
    assert code == 0, err
