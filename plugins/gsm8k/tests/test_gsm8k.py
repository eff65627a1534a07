"""Tests of the gsm8k task: loader (fixtures, bad rows, real data), formats, prompts, hint."""

from __future__ import annotations

import json
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from star_testkit import SHARED_DATA

from star_engine import Registry, Task, UserError
from star_gsm8k import plugin
from star_gsm8k.answers import final_answer, normalize_number
from star_gsm8k.prompts import EXAMPLES
from star_gsm8k.task import AnswerHint, GSM8KTask

HERE = Path(__file__).parent
TRAIN = HERE / "data" / "train_sample.jsonl"
REAL = SHARED_DATA / "gsm8k"
GOOD_ROW = {"question": "What is 2 + 2?", "answer": "2+2 = <<2+2=4>>4.\n#### 4"}


def create_task(**options):
    """The task built as the core builds it: its declared options checked by the registry first."""
    registry = Registry(autoload=False)
    registry.add(plugin)
    return registry.create("task", "gsm8k", options, "task.dataset", "task.options")


def cut(generation: str, stop: tuple[str, ...]) -> str:
    """What a backend returns: the generation cut before the first stop string."""
    ends = [generation.find(s) for s in stop if s in generation]
    return generation[: min(ends)] if ends else generation


@pytest.fixture
def task() -> GSM8KTask:
    return GSM8KTask()


def test_protocols_and_registration(task):
    assert isinstance(task, Task)
    tasks, hints = {}, {}
    plugin.register_tasks(register=lambda name, f: tasks.setdefault(name, f))
    plugin.register_hint_formatters(register=lambda name, f: hints.setdefault(name, f))
    assert tasks == {"gsm8k": GSM8KTask} and hints == {"gsm8k_answer": AnswerHint}
    assert (task.default_checker, task.default_hint) == ("numeric", "gsm8k_answer")
    assert "gsm8k" in {ep.name for ep in entry_points(group="star_engine")}


def test_load_fixture_strips_annotations(task):
    exs = task.load("train", str(TRAIN))
    assert [e.id for e in exs] == ["train-0", "train-1", "train-2"]
    assert [e.answer for e in exs] == ["32", "1350", "-6"]
    assert exs[0].fields["rationale"] == "Tom has 3*12 = 36 apples.\nAfter eating 4 he has 36-4 = 32 apples."
    # the blank line inside the solution is dropped, the question becomes one line
    assert exs[1].fields["rationale"] == "It makes 90*0.5 = $45 a day.\nIn 30 days it makes 45*30 = $1,350."
    assert task.context(exs[1]) == "Q: A farm sells 90 eggs a day for $0.5 each. How much money does it make in 30 days?\nA:"


def test_keep_annotations():
    ex = GSM8KTask(calculator_annotations="keep").load("train", str(TRAIN))[0]
    assert ex.fields["rationale"].startswith("Tom has 3*12 = <<3*12=36>>36 apples.")
    with pytest.raises(UserError, match=r"^task\.options\.calculator_annotations: must be one of strip, keep, "
                                        r"got 'drop'$") as e:
        create_task(calculator_annotations="drop")
    assert e.value.key == "task.options.calculator_annotations"


def test_gold_completions(task):
    exs = task.load("train", str(TRAIN))
    assert task.gold_completion(exs[0], direct=False) == (
        " Tom has 3*12 = 36 apples.\nAfter eating 4 he has 36-4 = 32 apples.\n#### 32")
    assert task.gold_completion(exs[1], direct=True) == " #### 1350"
    for ex in exs:
        for direct in (False, True):
            done = task.gold_completion(ex, direct)
            assert task.extract(done) == ex.answer
            assert cut(done, task.stop) == done  # a gold rationale never contains a stop string
    assert task.seed_examples() == []


@pytest.mark.parametrize("rows, message", [
    ([GOOD_ROW, {"question": "Q?"}], ":2: missing field 'answer'"),
    ([GOOD_ROW, {"answer": "#### 3"}], ":2: missing field 'question'"),
    (['{"question": "a", "answer": 5'], r":1:\d+: invalid JSON"),
    ([{"question": "a", "answer": "It is 5."}], ":1: field 'answer' has no final '#### <number>' line"),
    ([{"question": "a", "answer": "#### five"}], ":1: field 'answer': the final answer 'five' is not a number"),
    ([{"question": ["a"], "answer": "#### 5"}], ":1: field 'question' must be a string, got a list"),
    (['"just a string"'], ":1: expected a JSON object, got a string"),
])
def test_bad_rows_name_file_and_line(task, tmp_path, rows, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    with pytest.raises(UserError, match=re.escape(str(path)) + message):
        task.load("train", str(path))


def test_empty_split(task, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(UserError, match=re.escape(f"{path}: no examples")):
        task.load("test", str(path))
    with pytest.raises(UserError, match="task.data.test"):
        task.load("test", None)


@pytest.mark.parametrize("text, value", [
    ("72", "72"), (" 1,080", "1080"), ("$18.00", "18"), ("18.", "18"), ("-6", "-6"), ("\u22126", "-6"),
    ("0.50", "0.5"), ("36/2", "18"), ("7/2", "3.5"), ("1,000,000 dollars", "1000000"), ("$ 1,234.50", "1234.5"),
    ("50%", "50"), ("twelve", "twelve"), ("  ", None), ("1,0000", "1,0000"), ("18 or 20", "18 or 20"),
])
def test_normalize_number(text, value):
    assert normalize_number(text) == value


@pytest.mark.parametrize("generation, answer", [
    (" She has 3 * 4 = 12 apples.\nShe gives away 2, so 12 - 2 = 10.\n#### 10", "10"),
    (" 20 * $1.50 = $30.00\n#### $30.00\n\nQ: Another question?\nA: 5\n#### 5", "30"),
    (" The total is 2,400 dollars.\n####2,400.", "2400"),
    (" Half of 36 is 36/2.\n#### 36/2", "18"),
    (" He loses 5 - 8 = -3 points.\n#### -3", "-3"),
    (" She has 18 or 20.\n#### 18 or 20", "18 or 20"),  # two numbers: no number (star_filters.numbers)
    (" The answer is 12.", None),  # no #### line: no answer
    (" It is 4.\n#### \nmore", None),
    ("", None),
])
def test_extract(task, generation, answer):
    assert task.extract(generation) == answer == final_answer(generation)


def test_a_hedged_answer_is_wrong_here_as_in_the_numeric_checker(task, tmp_path):
    """"18 or 20" once read as 18 here and as no number in star_filters.numbers; one parser
    now decides both, and two numbers are no answer (plugins/filters/tests/test_numbers.py)."""
    from star_filters.checkers import NumericChecker

    generation = " 3 * 6 = 18, or 20 if she buys two more.\n#### 18 or 20"
    assert normalize_number("18 or 20") == "18 or 20" and task.extract(generation) == "18 or 20"
    assert not NumericChecker().check(generation, task.extract(generation), "18").correct
    path = tmp_path / "hedged.jsonl"
    path.write_text(json.dumps({"question": "How many?", "answer": "3 * 6 = 18.\n#### 18 or 20"}) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{path}:1: field 'answer': the final answer '18 or 20' is "
                                                  f"not a number")):
        task.load("train", str(path))


def test_stop_keeps_the_rationale_and_answer(task):
    raw = " There are 5 * 8 = 40 chairs.\n40 - 27 = 13 are empty.\n#### 13\n\nQ: A shop has 4 bags. How many?\nA:"
    kept = cut(raw, task.stop)
    assert kept == " There are 5 * 8 = 40 chairs.\n40 - 27 = 13 are empty.\n#### 13\n"
    assert task.extract(kept) == "13"


def test_hint(task):
    hint = AnswerHint()
    ex = task.load("train", str(TRAIN))[1]
    plain, hinted = task.context(ex), hint.context(task, ex)
    assert hinted == ("Q: A farm sells 90 eggs a day for $0.5 each. How much money does it make in 30 days?"
                      " (Answer: 1350)\nA:")
    assert "(Answer:" not in plain  # the stored context stays hint-free
    assert hint.leak_strings(task, ex) == ("(Answer: 1350)",)


def _blocks(prompt: str) -> list[str]:
    assert prompt.endswith("\n\n") and not prompt.endswith("\n\n\n")
    return prompt[:-2].split("\n\n")


def test_builtin_prompts(task):
    rationale, hint, direct = (_blocks(task.prompt(k)) for k in ("rationale", "hint", "direct"))
    assert len(rationale) == len(hint) == len(direct) == len(EXAMPLES) == 7
    for r, h, d, (question, steps, answer) in zip(rationale, hint, direct, EXAMPLES):
        assert r == f"Q: {question}\nA: " + "\n".join(steps) + f"\n#### {answer}"
        assert d == f"Q: {question}\nA: #### {answer}"
        assert h == r.replace("\nA:", f" (Answer: {answer})\nA:", 1)
        assert task.extract(r.split("\nA:")[1]) == answer
        for step in steps:  # the worked arithmetic in our prompts is right
            for lhs, rhs in re.findall(r"([\d.]+(?: [-+*/] [\d.]+)+) = \$?([\d.]+)", step):
                assert abs(eval(lhs) - float(rhs)) < 1e-9, step
    with pytest.raises(ValueError):
        task.prompt("cot")


def test_prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("Q: What is 1 + 1?\nA: 1 + 1 = 2.\n#### 2\n\nQ: What is 3 * 3?\nA: 3 * 3 = 9.\n#### 9\n")
    task = GSM8KTask(prompts_file=str(path))
    assert task.prompt("rationale") == path.read_text() + "\n"
    assert _blocks(task.prompt("hint"))[1] == "Q: What is 3 * 3? (Answer: 9)\nA: 3 * 3 = 9.\n#### 9"
    bad = tmp_path / "bad.txt"
    bad.write_text("Q: What is 1 + 1?\nA: 1 + 1 = 2.\n#### 2\n\n\nQ: Oops?\nA: no final line")
    with pytest.raises(UserError, match=re.escape(f"{bad}:6: the answer of this rationale prompt example")):
        GSM8KTask(prompts_file=str(bad))
    with pytest.raises(UserError, match=re.escape("task.options.direct_prompts_file: expected a string, got array")):
        create_task(direct_prompts_file=["a"])


@pytest.mark.real_data
@pytest.mark.skipif(not REAL.is_dir(), reason="shared/data is absent")
def test_real_files():
    task = GSM8KTask()
    counts = {}
    for split in ("train", "test"):
        exs = task.load(split, str(REAL / f"{split}.jsonl"))
        counts[split] = len(exs)
        for e in exs:
            assert re.fullmatch(r"-?\d+", e.answer), e
            assert "<<" not in e.fields["rationale"] and e.fields["rationale"]
            done = task.gold_completion(e, direct=False)
            assert task.extract(done) == e.answer and cut(done, task.stop) == done
        assert not {e.question for e in exs} & {q for q, _, _ in EXAMPLES}
    assert counts == {"train": 7473, "test": 1319}
