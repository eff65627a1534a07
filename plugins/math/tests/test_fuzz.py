r"""Fuzzing the math task's readers (hypothesis, fixed budget: conftest.py): MATH rows in both layouts
with any values, mutated files, prompt files, and answer extraction on any text. Each ends in examples
or a one-line ``UserError`` naming the file; extraction in an answer or None, never an exception."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from star_testkit.fuzzing import budget, json_values, mutated
from star_engine.errors import UserError
from star_math.answers import UnclosedBox, extract, last_boxed
from star_math.task import MATHTask

ROW = {"problem": "What is $\\frac{1}{2} + \\frac{1}{2}$?", "solution": "It is $\\boxed{1}$.", "level": "Level 1",
       "type": "Prealgebra"}
ROW500 = {"problem": "What is $2^3$?", "solution": "It is $\\boxed{8}$.", "answer": "8", "subject": "Algebra",
          "level": 1, "unique_id": "test/algebra/1.json"}
SOLUTIONS = st.text(alphabet="\\boxedfbx{}$ 1\n", max_size=30) | st.sampled_from(
    ["\\boxed{", "\\boxed", "\\fbox{}", "\\boxed{\\}", "\\boxed{\\\\}", "{" * 5000 + "\\boxed{1}", "\\boxed 5"])


def jsonl(rows: list) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def load(content: bytes, tmp_path_factory, **options) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "data.jsonl"
    path.write_bytes(content)
    try:
        examples = MATHTask(**options).load("dev", str(path))
    except UserError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e), e
        return
    assert all(e.id and e.question and e.answer for e in examples)


def edited(base: dict) -> st.SearchStrategy:
    return st.builds(lambda key, value: {**{k: v for k, v in base.items() if k != key}, **(
        {} if value is ... else {key: value})}, st.sampled_from(sorted(base)), json_values | SOLUTIONS | st.just(...))


@budget(150)
@given(rows=st.lists(st.just(ROW) | edited(ROW), min_size=1, max_size=4), solution=SOLUTIONS,
       classes=st.sampled_from(["subject", "level", "none"]))
def test_hendrycks_rows_with_any_values(tmp_path_factory, rows, solution, classes):
    load(jsonl(rows + [{**ROW, "solution": solution}]), tmp_path_factory, classes=classes)


@budget(100)
@given(rows=st.lists(st.just(ROW500) | edited(ROW500), min_size=1, max_size=4))
def test_math500_rows_with_any_values(tmp_path_factory, rows):
    load(jsonl(rows), tmp_path_factory, classes="level")


@budget(100)
@given(content=mutated(jsonl([ROW, {**ROW, "problem": "Another?"}]), max_edits=6))
def test_mutated_files(tmp_path_factory, content):
    load(content, tmp_path_factory)


@budget(100)
@given(content=mutated(b"Problem:\nx?\n\nSolution:\n$\\boxed{1}$\nFinal Answer: The final answer is $1$. "
                       b"I hope it is correct.\n\n", max_edits=6) | st.binary(max_size=120))
def test_prompt_files(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("fuzz") / "prompts.txt"
    path.write_bytes(content)
    try:
        task = MATHTask(prompts_file=str(path))
    except UserError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e), e
        return
    assert task.prompt("hint").startswith("Problem:")


@budget(200)
@given(text=st.text(alphabet="\\boxedfinalswrthI pc.{}$()[]\n5", max_size=60) | st.text(max_size=40))
def test_extraction_on_any_text(text):
    for mode in ("lenient", "boxed"):
        found = extract(text, mode)
        assert found is None or (isinstance(found, str) and found == found.strip() and found)
    for mode in ("hendrycks", "minerva"):  # the released conventions strip less and may read ""
        found = extract(text, mode)
        assert found is None or (isinstance(found, str) and found in text)
    try:
        last_boxed(text)
    except UnclosedBox as e:
        assert 0 <= e.offset < len(text) and text[e.offset] == "\\"
