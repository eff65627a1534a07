"""The example plugin on its own: generator, formats, JSONL loading, checker, hint, options."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

from star_engine import Example, Registry, Task, UserError
from star_plugin_example import plugin, units
from star_plugin_example.checker import UnitNumericChecker
from star_plugin_example.task import AnswerHint, UnitConversionTask

DATA = Path(__file__).resolve().parents[1] / "data"
SMALL = dict(n_train=60, n_dev=20, n_test=20, n_seed=30)


def small(**kw) -> UnitConversionTask:
    return UnitConversionTask(**{**SMALL, **kw})


def follow_rationale(text: str) -> tuple[Decimal, Decimal, str, Decimal]:
    """Re-do the rationale's arithmetic on its own terms: (value, factor, op, result)."""
    m = re.fullmatch(r" (\d+) (\w+) = (\d+) (\w+), so ([\d.]+) ([x/]) (\d+) = ([\d.]+)\. The answer is ([\d.]+) (\w+)\.\n",
                     text)
    assert m, text
    value, op, k, result = Decimal(m[5]), m[6], Decimal(m[7]), Decimal(m[8])
    assert result == (value * k if op == "x" else value / k)
    assert Decimal(m[9]) == result
    return value, k, op, result


def test_protocol_and_registration():
    assert isinstance(small(), Task)
    reg = Registry(autoload=False)
    info = reg.add(plugin)
    assert info.error is None
    assert info.components == {"task": ["unit_conversion"], "checker": ["unit_numeric"], "hint": ["unit_answer"]}
    task = reg.create("task", "unit_conversion", {"n_train": 5, "n_dev": 5, "n_test": 5, "n_seed": 5}, "task")
    assert task.default_checker == "unit_numeric" and task.default_hint == "unit_answer"


def test_generated_splits_are_seeded_disjoint_and_correct():
    a, b = small(), small()
    for split in ("train", "dev", "test"):
        assert a.load(split, None) == b.load(split, None)
    assert small(seed=1).load("dev", None) != a.load("dev", None)
    ids = {s: {e.id for e in a.load(s, None)} for s in ("train", "dev", "test")}
    assert [len(ids[s]) for s in ("train", "dev", "test")] == [60, 20, 20]
    assert not ids["train"] & ids["dev"] and not ids["train"] & ids["test"] and not ids["dev"] & ids["test"]
    # dev does not depend on the train size
    assert small(n_train=80).load("dev", None) == a.load("dev", None)
    for ex in a.load("train", None):
        value, src, dst = Decimal(ex.fields["value"]), units.UNITS[ex.fields["from"]], units.UNITS[ex.fields["to"]]
        assert ex.cls == src.family == dst.family
        assert ex.question == f"How many {dst.plural} are in {units.quantity(value, src)}?"
        gold, unit = ex.answer.split(" ")
        assert Decimal(gold) == value * src.size / dst.size and units.unit(unit) is dst


def test_gold_rationales_are_right_and_pass_the_checker():
    task, checker = small(decimals=2), UnitNumericChecker()
    for ex in task.load("train", None):
        text = task.gold_completion(ex, direct=False)
        value, k, op, result = follow_rationale(text)
        assert value == Decimal(ex.fields["value"]) and f"{units.fmt(result)} " in ex.answer + " "
        assert task.extract(text) == ex.answer
        assert checker.check(text, task.extract(text), ex.answer).correct
        direct = task.gold_completion(ex, direct=True)
        assert direct == f" The answer is {ex.answer}.\n" and task.extract(direct) == ex.answer
    assert task.stop == ("\n",)
    assert task.context(ex) == f"Q: {ex.question}\nA:"


def test_seed_examples_and_prompts():
    task = small(n_seed=10, seed_hint_fraction=0.5, n_shots=2)
    seeds = task.seed_examples()
    assert len(seeds) == 15
    dev = {task.context(e) for e in task.load("dev", None)}
    for s in seeds:
        follow_rationale(s.completion)
        assert s.prompt.endswith("\nA:") and re.sub(r" \(answer: [^)]*\)", "", s.prompt) not in dev
    assert sum("(answer:" in s.prompt for s in seeds) == 5
    assert task.prompt("rationale").count("Q: ") == 2 and task.prompt("rationale").endswith(".\n")
    assert task.prompt("hint").count("(answer: ") == 2
    assert task.prompt("direct").count(" The answer is ") == 2 and " x " not in task.prompt("direct")
    assert small().prompt("rationale") == ""
    with pytest.raises(ValueError):
        task.prompt("chat")


def test_jsonl_file():
    task = small()
    exs = task.load("dev", str(DATA / "dev_sample.jsonl"))
    assert [(e.id, e.question, e.answer, e.cls) for e in exs] == [
        ("pool", "How many centimetres are in 25 metres?", "2500 centimetres", "length"),
        ("flour", "How many grams are in 1.5 kilograms?", "1500 grams", "mass"),
        ("bottle", "How many litres are in 750 millilitres?", "0.75 litres", "volume"),
        ("film", "How many hours are in 135 minutes?", "2.25 hours", "time"),
    ]
    assert task.gold_completion(exs[3], False) == (" 60 minutes = 1 hour, so 135 / 60 = 2.25. "
                                                   "The answer is 2.25 hours.\n")


@pytest.mark.parametrize("line, message", [
    ('{"quantity": 3, "from": "m"}', "missing field 'to'"),
    ('{"quantity": 3, "from": "furlong", "to": "m"}', "from: unknown unit 'furlong'"),
    ('{"quantity": 3, "from": "kg", "to": "m"}', "cannot ask for metres in kilograms"),
    ('{"quantity": -3, "from": "km", "to": "m"}', "quantity: expected a positive number"),
    ('{"quantity": 3, "from": "km", "to": "m", "answer": "300 metres"}', "disagrees with the conversion (3000 metres)"),
    ('{"quantity": 3, "from": "km", "to": "m"', "invalid JSON"),
    ('[1, 2]', "expected a JSON object, got a list"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"quantity": 1, "from": "m", "to": "cm"}\n\n' + line + "\n")
    with pytest.raises(UserError) as e:
        small().load("dev", str(path))
    assert str(e.value).startswith(f"{path}:3:") and message in str(e.value)


@pytest.mark.parametrize("said, gold, options, correct, predicted", [
    ("350 centimetres", "350 centimetres", {}, True, "350 centimetres"),
    ("350 cm", "350 centimetres", {}, True, "350 centimetres"),
    ("3.5 m", "350 centimetres", {}, True, "3.5 metres"),
    ("3.5 m", "350 centimetres", {"convert": False}, False, "3.5 metres"),
    ("3500 MM", "350 centimetres", {}, True, "3500 millimetres"),
    ("350", "350 centimetres", {}, False, "350"),
    ("350", "350 centimetres", {"require_unit": False}, True, "350"),
    ("350.4 cm", "350 centimetres", {}, False, "350.4 centimetres"),
    ("350.4 cm", "350 centimetres", {"abs_tol": 0.5}, True, "350.4 centimetres"),
    ("351 cm", "350 centimetres", {"rel_tol": 0.01}, True, "351 centimetres"),
    ("355 cm", "350 centimetres", {"rel_tol": 0.01}, False, "355 centimetres"),
    ("350 grams", "350 centimetres", {}, False, "350 grams"),
    ("350 bananas", "350 centimetres", {}, False, "350 bananas"),
    ("about 350 cm", "350 centimetres", {}, False, "about 350 cm"),
    ("1,500 g", "1.5 kilograms", {}, True, "1500 grams"),
    ("1 metre", "1 metre", {}, True, "1 metre"),
    ("42", "42", {}, True, "42"),
])
def test_unit_numeric_checker(said, gold, options, correct, predicted):
    v = UnitNumericChecker(**options).check("...", said, gold)
    assert (v.correct, v.predicted) == (correct, predicted)


def test_checker_without_an_answer():
    assert UnitNumericChecker().check("no idea", None, "3 metres").correct is False


def test_hint_and_leaks():
    task = small()
    ex = task.load("dev", None)[0]
    hint = AnswerHint()
    ctx = hint.context(task, ex)
    assert ctx == f"Q: {ex.question} (answer: {ex.answer})\nA:"
    assert hint.leak_strings(task, ex) == (f"(answer: {ex.answer})", "(answer:")
    assert AnswerHint(label="hint").context(task, ex).endswith(f"(hint: {ex.answer})\nA:")

    class Odd:
        def context(self, example: Example) -> str:
            return example.question

    with pytest.raises(UserError, match="does not end with a line 'A:'"):
        hint.context(Odd(), ex)


@pytest.mark.parametrize("kind, name, options, message", [
    ("task", "unit_conversion", {"n_train": "10"}, "task.options.n_train: expected an integer, got string '10'"),
    ("task", "unit_conversion", {"families": ["length", "money"]}, "task.options.families: unknown 'money'"),
    ("task", "unit_conversion", {"families": []}, "task.options.families: must not be empty"),
    ("task", "unit_conversion", {"decimals": 4}, "task.options.decimals: must be in [0, 3], got 4"),
    ("task", "unit_conversion", {"seed_hint_fraction": 1.5}, "task.options.seed_hint_fraction: must be in [0, 1]"),
    ("task", "unit_conversion", {"n_shots": 300},
     "task.options.n_shots: the few-shot examples come from the seed set"),
    ("task", "unit_conversion", {"families": ["volume"], "max_value": 5, "decimals": 0}, "only 10 exist"),
    ("checker", "unit_numeric", {"abs_tol": -1}, "task.options.abs_tol: must be >= 0, got -1"),
    ("checker", "unit_numeric", {"convert": "yes"}, "task.options.convert: expected true or false"),
    ("hint", "unit_answer", {"label": "a(b"}, "task.options.label: must be a word"),
])
def test_bad_options(kind, name, options, message):
    """Options are checked as a run checks them: by the core, against what the factory
    declares, before it is built (the factory's own rules after)."""
    registry = Registry(autoload=False)
    registry.add(plugin)
    with pytest.raises(UserError, match=re.escape(message)):
        registry.create(kind, name, options, "task.options")


def test_ids_default_to_split_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('\n{"quantity": 2, "from": "h", "to": "min"}\n')
    (ex,) = small().load("test", str(path))
    assert (ex.id, ex.answer, ex.fields) == ("test-2", "120 minutes", {"value": "2", "from": "hour", "to": "minute"})


def test_unknown_split():
    with pytest.raises(UserError, match="unknown split 'heldout'"):
        small().load("heldout", None)
