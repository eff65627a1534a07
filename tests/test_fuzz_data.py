"""Fuzzing the data loaders through the task plugins (hypothesis, fixed budget: see conftest.py):
CommonsenseQA and GSM8K JSONL files and the prompt files of both, arbitrary or mutated from good
ones. Each ends in examples or a one-line ``UserError`` naming ``file:line``; never in another
exception (their parsing is not what is tested: what they accept stays as it was)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from star_testkit.fuzzing import budget, json_values, mutated
from star_engine.errors import UserError

star_cqa = pytest.importorskip("star_cqa.task")
star_gsm8k = pytest.importorskip("star_gsm8k.task")

CQA_ROW = {"answerKey": "B", "id": "q1", "question": {
    "question_concept": "milk", "stem": "Where is milk kept?",
    "choices": [{"label": "A", "text": "oven"}, {"label": "B", "text": "fridge"}, {"label": "C", "text": "roof"}]}}
GSM_ROW = {"question": "Tom has 3 apples and buys 2 more. How many apples does he have?",
           "answer": "He has 3+2 = <<3+2=5>>5 apples.\n#### 5"}
CQA_PROMPT = ("Q: Where would you keep milk?\nAnswer Choices:\n(a) oven\n(b) fridge\nA: Milk must stay cold. "
              "So the answer is fridge (b).\n\n")
GSM_PROMPT = "Q: Tom has 3 apples and buys 2. How many?\nA: 3 + 2 = 5.\n#### 5\n\n"


def _edit(row, path: list, value):
    """``row`` with the value at ``path`` replaced (or the key removed, for value ...)."""
    row = json.loads(json.dumps(row))
    node = row
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        node.pop(path[-1]) if isinstance(node, dict) else node.pop(path[-1])
    else:
        node[path[-1]] = value
    return row


CQA_PATHS = [["id"], ["answerKey"], ["question"], ["question", "stem"], ["question", "choices"],
             ["question", "choices", 0], ["question", "choices", 1, "label"], ["question", "choices", 2, "text"],
             ["question", "question_concept"]]
GSM_PATHS = [["question"], ["answer"]]
NUMBERS = st.sampled_from(["9" * 5000, "1e999999", "1/0", "0/0", "-", "1,000,000.5", "3/" + "7" * 4400,
                           "\u2212" + "4", "NaN", "Infinity", "1" + "0" * 30, ".5", "$1,0000"])


def rows(base: dict, paths: list[list]) -> st.SearchStrategy:
    edit = st.builds(lambda p, v: _edit(base, p, v), st.sampled_from(paths), json_values | st.just(...))
    return st.lists(st.just(base) | edit, min_size=1, max_size=4)


def jsonl(draw_rows: list, extra: list[bytes]) -> bytes:
    lines = [json.dumps(r).encode() for r in draw_rows] + extra
    return b"\n".join(lines) + b"\n"


raw_lines = st.lists(st.binary(max_size=40) | st.sampled_from([b"[" * 100_000, b'{"id": ' + b"9" * 5000 + b"}",
                                                                 b"\xef\xbb\xbf{}", b"\xff\xfe", b"null", b"\r"]),
                     max_size=2)


def load(task, content: bytes, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "data.jsonl"
    path.write_bytes(content)
    try:
        examples = task.load("train", str(path))
    except UserError as e:
        assert str(e).startswith(str(path)) or str(e).startswith("task.data."), e
        return
    assert all(e.id and isinstance(e.question, str) for e in examples)


@budget(150)
@given(data=rows(CQA_ROW, CQA_PATHS), extra=raw_lines)
def test_cqa_rows_with_any_values(tmp_path_factory, data, extra):
    load(star_cqa.CQATask(), jsonl(data, extra), tmp_path_factory)


@budget(100)
@given(content=mutated(jsonl([CQA_ROW, _edit(CQA_ROW, ["id"], "q2")], []), max_edits=6))
def test_cqa_mutated_files(tmp_path_factory, content):
    load(star_cqa.CQATask(), content, tmp_path_factory)


@budget(150)
@given(data=rows(GSM_ROW, GSM_PATHS), extra=raw_lines,
       answer=st.builds(lambda n, pre: f"{pre}#### {n}", NUMBERS | st.text(max_size=12), st.text(max_size=8)))
def test_gsm8k_rows_with_any_values(tmp_path_factory, data, extra, answer):
    load(star_gsm8k.GSM8KTask(), jsonl(data + [{"question": "q?", "answer": answer}], extra), tmp_path_factory)


@budget(100)
@given(content=mutated(jsonl([GSM_ROW, GSM_ROW], []), max_edits=6))
def test_gsm8k_mutated_files(tmp_path_factory, content):
    load(star_gsm8k.GSM8KTask(), content, tmp_path_factory)


@budget(100)
@given(task=st.sampled_from(["cqa", "gsm8k"]), which=st.sampled_from(["prompts_file", "hint_prompts_file",
                                                                       "direct_prompts_file"]),
       content=st.one_of(mutated((CQA_PROMPT * 2).encode(), max_edits=6), mutated((GSM_PROMPT * 2).encode(), 6),
                         st.binary(max_size=200), NUMBERS.map(lambda n: f"Q: x\nA: y\n#### {n}\n".encode())))
def test_prompt_files(tmp_path_factory, task, which, content):
    path = tmp_path_factory.mktemp("fuzz") / "prompts.txt"
    path.write_bytes(content)
    factory = star_cqa.CQATask if task == "cqa" else star_gsm8k.GSM8KTask
    try:
        made = factory(**{which: str(path)})
    except UserError as e:
        assert str(e).startswith(str(path)), e
        return
    assert isinstance(made.prompt("rationale"), str)
