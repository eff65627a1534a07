"""Tests of the cqa task: loader (fixtures, bad rows, real data), formats, prompts, hint."""

from __future__ import annotations

import json
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from star_testkit import SHARED_DATA

from star_cqa import plugin
from star_cqa.prompts import EXAMPLES
from star_cqa.task import CorrectHint, CQATask, extract_letter
from star_engine import Registry, Task, UserError

HERE = Path(__file__).parent
TRAIN = HERE / "data" / "train_sample.jsonl"
TEST = HERE / "data" / "test_sample.jsonl"
REAL = SHARED_DATA / "commonsenseqa"

GOOD_ROW = {"answerKey": "B", "id": "r1", "question": {"question_concept": "x", "stem": "Which?", "choices": [
    {"label": L, "text": f"choice {L}"} for L in "ABCDE"]}}


def cut(generation: str, stop: tuple[str, ...]) -> str:
    """What a backend returns: the generation cut before the first stop string."""
    ends = [generation.find(s) for s in stop if s in generation]
    return generation[: min(ends)] if ends else generation


def write_rows(tmp_path: Path, rows: list, name: str = "bad.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return p


@pytest.fixture
def task() -> CQATask:
    return CQATask()


def test_protocols_and_registration():
    task = CQATask()
    assert isinstance(task, Task)
    assert all(callable(getattr(CorrectHint(), m)) for m in ("context", "leak_strings"))  # HintFormatter
    tasks, hints = {}, {}
    plugin.register_tasks(register=lambda name, f: tasks.setdefault(name, f))
    plugin.register_hint_formatters(register=lambda name, f: hints.setdefault(name, f))
    assert tasks == {"cqa": CQATask} and hints == {"cqa_correct": CorrectHint}
    assert (task.default_checker, task.default_hint) == ("mc_letter", "cqa_correct")
    assert "cqa" in {ep.name for ep in entry_points(group="star_engine")}


def test_load_fixture(task):
    exs = task.load("train", str(TRAIN))
    assert [e.id for e in exs] == ["fx-001", "fx-002", "fx-003"]
    assert [e.answer for e in exs] == ["c", "a", "e"]  # lowercased, "e" accepted too
    assert all(e.cls == "all" for e in exs)
    assert exs[0].fields["choices"][2] == {"label": "c", "text": "rainy street"}
    assert exs[0].fields["concept"] == "umbrella"
    assert exs[2].question == "What does a bird do  in spring before laying eggs?"  # text kept as is
    json.dumps([e.fields for e in exs])  # fields must be JSON-serialisable


def test_context_format(task):
    ex = task.load("train", str(TRAIN))[0]
    assert task.context(ex) == (
        "Q: Where would you most likely need an umbrella?\nAnswer Choices:\n(a) sunny beach\n(b) oven\n"
        "(c) rainy street\n(d) library shelf\n(e) desert\nA:")


def test_test_split_has_no_answers(task):
    exs = task.load("test", str(TEST))
    assert [e.answer for e in exs] == ["", ""]
    with pytest.raises(UserError, match="no gold answer"):
        task.gold_completion(exs[0], direct=True)
    with pytest.raises(UserError, match="no gold answer"):
        CorrectHint().context(task, exs[0])


@pytest.mark.parametrize("rows, message", [
    ([GOOD_ROW, {k: v for k, v in GOOD_ROW.items() if k != "answerKey"}], ":2: missing field 'answerKey'"),
    ([GOOD_ROW, '{"id": "r2", "question": '], r":2:\d+: invalid JSON"),
    ([GOOD_ROW, "[1, 2]"], ":2: expected a JSON object, got a list"),
    ([{**GOOD_ROW, "question": {"choices": GOOD_ROW["question"]["choices"]}}], ":1: missing field 'question.stem'"),
    ([{**GOOD_ROW, "id": 7}], ":1: field 'id' must be a string, got an integer"),
    ([{**GOOD_ROW, "answerKey": "F"}], ":1: field 'answerKey' is 'F', which names no choice"),
    ([{**GOOD_ROW, "question": {**GOOD_ROW["question"], "choices": [{"label": "A"}]}}],
     r":1: missing field 'question.choices\[0\].text'"),
    ([{**GOOD_ROW, "question": {**GOOD_ROW["question"], "choices": [{"label": "AB", "text": "t"}]}}],
     r":1: field 'question.choices\[0\].label' must be one letter"),
    ([GOOD_ROW, GOOD_ROW], ":2: duplicate id 'r1'"),
    ([{**GOOD_ROW, "question": {**GOOD_ROW["question"], "stem": "  "}}], ":1: field 'question.stem' is empty"),
])
def test_bad_rows_name_file_and_line(task, tmp_path, rows, message):
    path = write_rows(tmp_path, rows)
    with pytest.raises(UserError, match=re.escape(str(path)) + message):
        task.load("train", str(path))


def test_bad_files(task, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(UserError, match=re.escape(f"{empty}: no examples")):
        task.load("dev", str(empty))
    with pytest.raises(UserError, match="cannot read"):
        task.load("dev", str(tmp_path / "missing.jsonl"))
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(json.dumps(GOOD_ROW).encode() + b"\n\xff\xfe\n")
    with pytest.raises(UserError, match=re.escape(f"{binary}:2: not valid UTF-8")):
        task.load("dev", str(binary))
    with pytest.raises(UserError, match="task.data.dev"):
        task.load("dev", None)


@pytest.mark.parametrize("generation, letter", [
    (" The answer must be used to absorb ink. Blotters absorb liquids. Therefore, the answer is blotter (e).", "e"),
    (" Therefore, the answer is blotter (E).", "e"),
    (" the answer is blotter (e).\n\nQ: Where is a (a) thing?", "e"),  # only the first line counts
    ("\n Rivers flow. So the answer is ( c )", "c"),
    (" Options (a) and (b) are wrong, so the answer is apple (d).", "d"),  # the last letter on the line
    (" The answer is (B)", "b"),
    # No letter on the first line: the first "answer is ... (x)" anywhere (what mc_letter once
    # searched for itself; the task is now the one place a letter is read).
    (" I am not sure.\nThe answer is (c).", "c"),
    (" Blotters absorb ink (see above).\nSo the answer is blotter (e).\nOr the answer is (a).", "e"),
    (" I am not sure.\nThe answer is C.", None),  # a bare letter is not taken: "answer is a ..." is ambiguous
    (" The answer is blotter.", None),
    ("", None),
])
def test_extract(task, generation, letter):
    assert task.extract(generation) == letter
    assert extract_letter(generation) == letter


def test_stop_keeps_one_line_answer(task):
    raw = " People sleep at night. Therefore, the answer is bed (a).\n\nQ: What (b) next?\nAnswer Choices:"
    assert cut(raw, task.stop) == " People sleep at night. Therefore, the answer is bed (a)."
    assert task.extract(cut(raw, task.stop)) == "a"


def test_gold_completion_direct(task):
    for ex in task.load("train", str(TRAIN)):
        done = task.gold_completion(ex, direct=True)
        assert done.startswith(" The answer is ") and done.endswith(f" ({ex.answer}).")
        assert task.extract(done) == ex.answer
    with pytest.raises(UserError, match="no gold rationales"):
        task.gold_completion(ex, direct=False)
    assert task.seed_examples() == []


def test_hint_marks_only_the_gold_choice(task):
    hint = CorrectHint()
    for ex in task.load("train", str(TRAIN)):
        plain, hinted = task.context(ex), hint.context(task, ex)
        assert "CORRECT" not in plain  # the stored context stays hint-free
        assert hinted.count("(CORRECT)") == 1 and hinted.endswith("\nA:")
        marked = next(line for line in hinted.split("\n") if line.endswith(" (CORRECT)"))
        assert marked.startswith(f"({ex.answer}) ")
        assert hinted.replace(" (CORRECT)", "") == plain
        assert hint.leak_strings(task, ex) == ("(CORRECT)", "CORRECT")


def _blocks(prompt: str) -> list[str]:
    assert prompt.endswith("\n\n") and not prompt.endswith("\n\n\n")
    return prompt[:-2].split("\n\n")


def test_builtin_prompts(task):
    rationale, hint, direct = (_blocks(task.prompt(k)) for k in ("rationale", "hint", "direct"))
    assert len(rationale) == len(hint) == len(direct) == len(EXAMPLES) == 7
    for r, h, d, (_, choices, letter, _) in zip(rationale, hint, direct, EXAMPLES):
        answer_r, answer_d = r.split("\nA:")[1], d.split("\nA:")[1]
        assert re.fullmatch(r" .+ Therefore, the answer is .+ \([a-e]\)\.", answer_r)
        assert task.extract(answer_r) == task.extract(answer_d) == letter
        assert h.count(" (CORRECT)") == 1 and f"({letter}) {choices['abcde'.index(letter)]} (CORRECT)" in h
        assert h.replace(" (CORRECT)", "") == r
        assert r.startswith("Q: ") and r.split("\nA:")[0] == d.split("\nA:")[0]
    assert len({letter for _, _, letter, _ in EXAMPLES}) == 5  # every position is a gold answer somewhere
    with pytest.raises(ValueError):
        task.prompt("cot")


def test_prompts_file(tmp_path):
    text = ("Q: What keeps you dry?\nAnswer Choices:\n(a) towel\n(b) raincoat\nA: Rain wets you. "
            "Therefore, the answer is raincoat (b).\n\n\n"
            "Q: What is cold?\nAnswer Choices:\n(a) ice\n(b) fire\nA: Ice is frozen. Therefore, the answer is ice (a).\n")
    path = tmp_path / "prompts.txt"
    path.write_text(text)
    task = CQATask(prompts_file=str(path))
    blocks = _blocks(task.prompt("rationale"))
    assert len(blocks) == 2 and blocks[1].startswith("Q: What is cold?")
    hint = _blocks(task.prompt("hint"))
    assert "(b) raincoat (CORRECT)" in hint[0] and "(a) ice (CORRECT)" in hint[1]
    assert task.prompt("direct") == CQATask().prompt("direct")  # built-in unless given
    own_hint = tmp_path / "hint.txt"
    own_hint.write_text("Q: X?\nAnswer Choices:\n(a) y (CORRECT)\n(b) z\nA: Because. Therefore, the answer is y (a).")
    assert CQATask(prompts_file=str(path), hint_prompts_file=str(own_hint)).prompt("hint") == own_hint.read_text() + "\n\n"


@pytest.mark.parametrize("text, message", [
    ("Q: a?\nAnswer Choices:\n(a) x\nA: yes (a).\n\nQ: b?\n(a) x\nno answer line", ":6: a rationale prompt example"),
    ("Q: a?\nAnswer Choices:\n(a) x\nA: it is x.", ":1: the answer of this rationale prompt example ends in no letter"),
    ("Q: a?\nAnswer Choices:\n(a) x\nA: it is y (b).", ":1: cannot mark the correct choice"),
    ("\n\n", ": no examples"),
])
def test_bad_prompts_file(tmp_path, text, message):
    path = tmp_path / "p.txt"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(str(path)) + message):
        CQATask(prompts_file=str(path))


def test_bad_option_value(tmp_path):
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError, match=r"^task\.options\.prompts_file: expected a string, got integer 3$") as e:
        registry.create("task", "cqa", {"prompts_file": 3}, "task.dataset", "task.options")
    assert e.value.key == "task.options.prompts_file"
    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'absent.txt'}: cannot read")) as e:
        registry.create("task", "cqa", {"prompts_file": str(tmp_path / "absent.txt")}, "task.dataset", "task.options")
    assert e.value.key == "task.options"


@pytest.mark.real_data
@pytest.mark.skipif(not REAL.is_dir(), reason="shared/data is absent")
def test_real_files():
    task = CQATask()
    counts = {}
    for split, name in [("train", "train_rand_split"), ("dev", "dev_rand_split"),
                        ("test", "test_rand_split_no_answers")]:
        exs = task.load(split, str(REAL / f"{name}.jsonl"))
        counts[split] = len(exs)
        assert len({e.id for e in exs}) == len(exs)
        assert all(len(e.fields["choices"]) == 5 for e in exs)
        if split == "test":
            assert all(e.answer == "" for e in exs)
        else:
            assert {e.answer for e in exs} == set("abcde")
            for e in exs:  # the direct gold completion round-trips through extraction
                assert task.extract(task.gold_completion(e, direct=True)) == e.answer
        stems = {e.question for e in exs}
        assert not stems & {stem for stem, *_ in EXAMPLES}  # our prompts are not dataset questions
    assert counts == {"train": 9741, "dev": 1221, "test": 1140}
