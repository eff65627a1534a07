"""The math task: both layouts, classes, the MATH-500 option, bad rows and caps."""

from __future__ import annotations

import json
import re
from importlib import metadata
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from star_engine.api import Task
from star_engine.errors import UserError
from star_engine.config.registry import Registry
from star_math import data as mathdata
from star_math import plugin
from star_math.task import AnswerHint, MATHTask

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "math_train_sample.jsonl"  # Hendrycks layout
MATH500 = DATA / "math500_sample.jsonl"  # MATH-500 layout
FULL_TEST = DATA / "math_test_sample.jsonl"  # Hendrycks layout, MATH-500's problems among others
ROW = {"problem": "What is $1 + 1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Prealgebra"}
ROW500 = {"problem": "What is $1 + 1$?", "solution": "It is $\\boxed{2}$.", "answer": "2", "subject": "Prealgebra",
          "level": 1, "unique_id": "test/prealgebra/1.json"}


def write(tmp_path: Path, *rows) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


def test_protocol_registration_and_dependencies():
    task = MATHTask()
    assert isinstance(task, Task)
    tasks, hints = {}, {}
    plugin.register_tasks(register=lambda name, f: tasks.setdefault(name, f))
    plugin.register_hint_formatters(register=lambda name, f: hints.setdefault(name, f))
    assert tasks == {"math": MATHTask} and hints == {"math_answer": AnswerHint}
    assert (task.default_checker, task.default_hint) == ("math_verify", "math_answer")
    assert "math" in {ep.name for ep in entry_points(group="star_engine")}
    # the default checker's distribution is declared (tests/test_plugin_dependencies.py's rule)
    requires = [re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0] for r in metadata.requires("star-engine-math")]
    assert "star-engine-mathverify" in requires


def test_hendrycks_layout():
    exs = MATHTask().load("train", str(TRAIN))
    assert [e.id for e in exs] == [f"train-{i}" for i in range(6)]
    assert [e.answer for e in exs] == ["18", "12", "\\frac{\\sqrt{3}}{2}", "42", "4", "-2, 3"]  # \fbox, nested,
    assert [e.cls for e in exs] == ["algebra", "prealgebra", "precalculus", "number_theory",  # last of two, \boxed 4
                                    "counting_and_probability", "intermediate_algebra"]
    assert exs[3].fields == {"solution": json.loads(TRAIN.read_text().splitlines()[3])["solution"],
                             "subject": "Number Theory", "level": None}
    assert exs[0].question == "What is the value of $x$ if $\\frac{x}{3} + 4 = 10$?"


def test_math500_layout_takes_its_answer_field():
    exs = MATHTask().load("dev", str(MATH500))
    assert [e.id for e in exs] == ["test/algebra/2101.json", "test/precalculus/1203.json",
                                   "test/intermediate_algebra/1994.json", "test/number_theory/1032.json",
                                   "test/prealgebra/1302.json"]
    assert exs[2].answer == "(-1,5]"  # the answer field, not the box's "(-1, 5]"
    assert exs[1].answer == "\\begin{pmatrix} 11 \\\\ 4 \\end{pmatrix}" and exs[4].answer == "\\text{(B)}"
    assert exs[4].question.startswith("Which of these numbers is the largest?\n\n(A) $\\frac{2}{3}$\n")
    assert [e.fields["level"] for e in exs] == [2, 4, 3, 3, 1]


@pytest.mark.parametrize("classes, train, dev", [
    ("level", ["level_2", "level_1", "level_3", "level_unknown", "level_4", "level_5"],
     ["level_2", "level_4", "level_3", "level_3", "level_1"]),
    ("none", ["all"] * 6, ["all"] * 5),
])
def test_classes(classes, train, dev):
    assert [e.cls for e in MATHTask(classes=classes).load("train", str(TRAIN))] == train
    assert [e.cls for e in MATHTask(classes=classes).load("dev", str(MATH500))] == dev


def test_math500_file_keeps_its_problems_in_dev_and_drops_them_from_train():
    task = MATHTask(math500_file=str(MATH500))
    dev = task.load("dev", str(FULL_TEST))
    # MATH-500's five, in the full file's order, with MATH-500's ids (two rows there have none: matched by text)
    assert [e.id for e in dev] == ["test/number_theory/1032.json", "test/algebra/2101.json",
                                   "test/prealgebra/1302.json", "test/intermediate_algebra/1994.json",
                                   "test/precalculus/1203.json"]
    assert dev[3].answer == "(-1, 5]"  # each row's own gold: this file's box
    train = task.load("train", str(FULL_TEST))
    assert [e.id for e in train] == ["test/prealgebra/88.json", "test/number_theory/411.json"]
    assert [e.id for e in task.load("dev", str(MATH500))] == [e.id for e in MATHTask().load("dev", str(MATH500))]
    assert len(task.load("train", str(TRAIN))) == 6  # MATH's train split holds no MATH-500 problem


def test_math500_file_needs_all_of_its_problems(tmp_path):
    partial = write(tmp_path, *[json.loads(line) for line in FULL_TEST.read_text().splitlines()[:3]])
    with pytest.raises(UserError, match=re.escape(f"{partial}: 3 of the 5 problems of {MATH500} "
                                                  "(task.options.math500_file) are not in this file, e.g. "
                                                  "'test/precalculus/1203.json'; split 'dev' keeps only them")):
        MATHTask(math500_file=str(MATH500)).load("dev", str(partial))
    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'nope.jsonl'}: cannot read")):
        MATHTask(math500_file=str(tmp_path / "nope.jsonl")).load("dev", str(MATH500))
    reg = Registry(autoload=False)
    reg.add(plugin)
    for value, message in [(3, "task.options.math500_file: expected a string, got integer 3"),
                           ("", "task.options.math500_file: must not be empty")]:
        with pytest.raises(UserError, match="^" + re.escape(message)):
            reg.create("task", "math", {"math500_file": value}, "task.dataset", "task.options")


BAD = [
    ([ROW, b'{"problem": "x", '], ":2:", "invalid JSON"),
    ([ROW, b"[1, 2]"], ":2: ", "expected a JSON object, got a list"),
    ([ROW, b'"text"'], ":2: ", "expected a JSON object, got a string"),
    ([ROW, b'{"problem": "\xc3(", "solution": "x"}'], ":2: ", "not valid UTF-8"),
    ([ROW, {k: v for k, v in ROW.items() if k != "solution"}], ":2: ", "missing field 'solution'"),
    ([ROW, {k: v for k, v in ROW.items() if k != "type"}], ":2: ", "missing field 'type'"),
    ([ROW, {**ROW, "problem": ["x"]}], ":2: ", "field 'problem' must be a string, got a list"),
    ([ROW, {**ROW, "problem": "  "}], ":2: ", "field 'problem' is empty"),
    ([ROW, {**ROW, "level": 3}], ":2: ", "field 'level' must be a string, got an integer"),
    ([ROW, {**ROW, "level": "Hard"}], ":2: ", "field 'level' must be 'Level <n>' or 'Level ?', got 'Hard'"),
    ([ROW, {**ROW, "level": "Level " + "9" * 5000}], ":2: ", "field 'level' must be 'Level <n>' or 'Level ?'"),
    ([ROW, {**ROW, "unique_id": 7}], ":2: ", "field 'unique_id' must be a string"),
    ([ROW, {**ROW, "solution": "So $x = \\boxed{\\frac{1}{2}$."}], ":2: ",
     "field 'solution': \\boxed{ at character 9 never closes"),
    ([ROW, {**ROW, "solution": "It is $2$."}], ":2: ", "field 'solution' has no \\boxed{...} answer"),
    ([ROW, {**ROW, "solution": "It is $\\boxed{ }$."}], ":2: ", "field 'solution' has no \\boxed{...} answer"),
    ([ROW500, {**ROW500, "unique_id": "b", "level": "Level 1"}], ":2: ", "field 'level' must be an integer"),
    ([ROW500, {**ROW500, "unique_id": "b", "level": 0}], ":2: ", "field 'level' must be an integer >= 1, got 0"),
    ([ROW500, {**ROW500, "unique_id": "b", "level": True}], ":2: ", "field 'level' must be an integer, got a boolean"),
    ([ROW500, {k: v for k, v in ROW500.items() if k != "unique_id"}], ":2: ", "missing field 'unique_id'"),
    ([ROW500, {**ROW500, "unique_id": "b", "answer": ""}], ":2: ", "field 'answer' is empty"),
    ([ROW500, {**ROW500, "unique_id": "b", "solution": "$\\fbox{2$"}], ":2: ",
     "field 'solution': \\fbox{ at character 2 never closes"),
    ([ROW500, ROW500], ":2: ", "duplicate unique_id 'test/prealgebra/1.json' (first at "),
]


@pytest.mark.parametrize("rows, at, message", BAD, ids=[m for _, _, m in BAD])
def test_bad_rows_name_file_and_line(tmp_path, rows, at, message):
    path = write(tmp_path, *rows)
    with pytest.raises(UserError) as e:
        MATHTask().load("train", str(path))
    assert str(e.value).startswith(f"{path}{at}") and message in str(e.value) and "\n" not in str(e.value)


def test_empty_and_missing_files(tmp_path):
    empty = write(tmp_path)
    with pytest.raises(UserError, match=re.escape(f"{empty}: no examples (the file is empty)")):
        MATHTask().load("dev", str(empty))
    with pytest.raises(UserError, match=re.escape("task.data.dev: the math task reads its data from a file")):
        MATHTask().load("dev", None)


def test_caps_are_checked_before_parsing(tmp_path, monkeypatch):
    path = write(tmp_path, ROW, ROW, b"not even json")
    monkeypatch.setattr(mathdata, "MAX_LINES", 2)
    with pytest.raises(UserError, match=re.escape(f"{path}: 3 lines, more than the limit of 2")):
        MATHTask().load("train", str(path))
    monkeypatch.setattr(mathdata, "MAX_BYTES", 100)
    with pytest.raises(UserError, match=re.escape(f"{path}: {path.stat().st_size} bytes, more than the limit of 100")):
        MATHTask().load("train", str(path))


@pytest.mark.parametrize("options, message", [
    ({"classes": "topic"}, "task.options.classes: must be one of subject, level, none, got 'topic'"),
    ({"extraction": "last"}, "task.options.extraction: must be one of lenient, boxed, hendrycks, minerva, got 'last'"),
    ({"stored_completion": "all"}, "task.options.stored_completion: must be one of final_answer, until_stop"),
    ({"stop": "Problem:"}, "task.options.stop: expected a list of strings, got string 'Problem:'"),
    ({"stop": ["\nProblem:", ""]}, "task.options.stop: must be a list of non-empty strings"),
    ({"prompts_file": ""}, "task.options.prompts_file: must not be empty"),
    ({"level": 3}, "task.options.level: unknown option for task 'math'; accepted: classes, math500_file"),
])
def test_option_errors_through_the_registry(options, message):
    reg = Registry(autoload=False)
    assert reg.add(plugin).error is None
    with pytest.raises(UserError) as e:
        reg.create("task", "math", options, "task.dataset", "task.options")
    assert message in str(e.value), str(e.value)
    with pytest.raises(UserError, match=r"^task\.hint\.show: must be one of answer, solution, got 'both'$"):
        reg.create("hint", "math_answer", {"show": "both"}, "task.hint")
