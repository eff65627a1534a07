r"""Bad MATH data through the command line: ``star-engine run`` prints one line naming file:line,
exits 2 and writes nothing (the scripted backend stands in for a model; the ``exact`` checker for
``math_verify``, so that these run without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_testkit import TESTS

DATA = Path(__file__).parent / "data"
ROW = {"problem": "What is $1 + 1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Prealgebra"}
EXPERIMENT = """
[experiment]
name = "bad_math"
iterations = 1
output_dir = "{out}"

[task]
dataset = "math"
checker = "exact"
data = {{ train = "{train}", dev = "{dev}" }}
options = {{ {options} }}

[model]
backend = "scripted"
"""


def run(tmp_path: Path, train: Path, dev: Path, options: str = "", command: str = "run") -> subprocess.CompletedProcess:
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix(), train=train.as_posix(), dev=dev.as_posix(),
                                      options=options))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    env.update({"STAR_ENGINE_PLUGINS": "star_testkit.scripted", "STAR_ENGINE_BLOCK_PLUGINS": "tracking,haiku_xmap",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))})
    return subprocess.run([sys.executable, "-m", "star_engine", command, str(toml)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


CASES = [
    ("not_json", b'{"problem": "x", "solution": ', "train", ":2:30: ", "invalid JSON: Expecting value"),
    ("missing_field", json.dumps({k: v for k, v in ROW.items() if k != "type"}).encode(), "train", ":2: ",
     "missing field 'type'"),
    ("wrong_type", json.dumps({**ROW, "solution": 3}).encode(), "train", ":2: ",
     "field 'solution' must be a string, got an integer"),
    ("unclosed_box", json.dumps({**ROW, "solution": "So $x = \\boxed{\\frac{1}{2}$."}).encode(), "train", ":2: ",
     "field 'solution': \\boxed{ at character 9 never closes"),
    ("unclosed_box_in_math500", (DATA / "math500_sample.jsonl").read_bytes().replace(b"\\\\boxed{13}", b"\\\\boxed{13"),
     "dev", ":1: ", "field 'solution': \\boxed{ at character"),
]


@pytest.mark.parametrize("name, second, split, at, message", CASES, ids=[c[0] for c in CASES])
def test_bad_rows_exit_2_with_one_line_and_write_nothing(tmp_path, name, second, split, at, message):
    bad = tmp_path / "bad.jsonl"
    good = DATA / ("math_train_sample.jsonl" if split == "train" else "math500_sample.jsonl")
    bad.write_bytes(second if name == "unclosed_box_in_math500" else json.dumps(ROW).encode() + b"\n" + second + b"\n")
    res = run(tmp_path, bad if split == "train" else DATA / "math_train_sample.jsonl",
              bad if split == "dev" else good)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.startswith(f"error: {bad}{at}") and message in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr and res.stdout == ""
    assert not (tmp_path / "run").exists()


def test_missing_math500_problems_exit_2(tmp_path):
    res = run(tmp_path, DATA / "math_train_sample.jsonl", DATA / "math_train_sample.jsonl",
              f'math500_file = "{(DATA / "math500_sample.jsonl").as_posix()}"')
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "5 of the 5 problems of" in res.stderr and "split 'dev' keeps only them" in res.stderr
    assert not (tmp_path / "run").exists()


def test_good_files_validate(tmp_path):
    """The same experiment with good files passes: the failures above are the rows'."""
    res = run(tmp_path, DATA / "math_test_sample.jsonl", DATA / "math_test_sample.jsonl",
              f'math500_file = "{(DATA / "math500_sample.jsonl").as_posix()}", classes = "level"', command="validate")
    assert res.returncode == 0, res.stderr
    assert "OK (task math: train=2, dev=5;" in res.stdout  # MATH-500's five kept in dev, dropped from train
    assert not (tmp_path / "run").exists()
