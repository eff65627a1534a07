"""A component that returns what its protocol does not allow (a checker's bool for a
``Verdict``, a filter's flags that are not one per candidate, a schedule's negative or
fractional steps, a task's ``extract`` of a number) stops the run with one line naming its
plugin, the method and what it returned, exit code 2: the plugin's fault, not the core's nor the
backend's. Its author gets the traceback of what a plugin raised with ``STAR_ENGINE_TRACEBACK=1``,
and the run's ``fatal`` event holds it."""

from __future__ import annotations

import json
import textwrap

import pytest

from star_engine.cli import main

BROKEN = '''
import numpy
from star_engine import Verdict, hookimpl
from star_testkit.scripted import ToyTask


class BoolChecker:
    def check(self, generation, extracted, gold):
        return extracted == gold


class ShortFilter:
    def keep(self, candidates, history):
        return [True] * (len(candidates) - 1)


class Steps:
    def __init__(self, value: float = -3):
        self.value = value

    def steps(self, iteration, n_examples, batch_size, grad_accum):
        return numpy.int64(self.value) if self.value == 4 else self.value  # a numpy integer is an int


class NumberTask(ToyTask):
    def extract(self, generation):
        found = super().extract(generation)
        return None if found is None else int(found)


class RaisingChecker:
    def check(self, generation, extracted, gold):
        return helper(extracted)


def helper(extracted):
    raise ZeroDivisionError("deep inside the plugin")


@hookimpl
def register_checkers(register):
    register("bool_checker", BoolChecker)
    register("raising_checker", RaisingChecker)


@hookimpl
def register_filters(register):
    register("short_filter", ShortFilter)


@hookimpl
def register_schedules(register):
    register("bad_steps", Steps)


@hookimpl
def register_tasks(register):
    register("number_task", NumberTask)
'''


@pytest.fixture
def broken(scripted, tmp_path, monkeypatch):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "broken_protocol.py").write_text(textwrap.dedent(BROKEN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,broken_protocol")


@pytest.mark.parametrize("setting,says", [
    ('task.checker={name = "bool_checker"}',
     "checker 'bool_checker'.check returned False, expected a star_engine.Verdict"),
    ('task.filters=["short_filter"]', "filter 'short_filter'.keep returned [True"),
    ('training.schedule={name = "bad_steps"}', "schedule 'bad_steps'.steps returned -3, expected an int >= 0"),
    ('training.schedule={name = "bad_steps", value = 2.5}', "schedule 'bad_steps'.steps returned 2.5, expected an int"),
    ('task.dataset="number_task"', "task 'number_task'.extract returned "),
])
def test_a_broken_protocol_names_the_plugin(broken, toy_toml, capsys, setting, says):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plugin 'broken_protocol'") and says in err and err.count("\n") == 1, err
    assert "bug in" not in err and "Traceback" not in err


def test_a_numpy_integer_of_steps_is_an_int(broken, toy_toml, capsys):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", 'training.schedule={name = "bad_steps", value = 4}']) == 0, \
        capsys.readouterr().err
    assert json.loads((path.parent / "run" / "iterations" / "001" / "train.json").read_text())["steps"] == 4


def test_what_a_plugin_raised_keeps_its_traceback(broken, toy_toml, capsys, monkeypatch):
    path = toy_toml()
    args = ["run", str(path), "--quiet", "--set", 'task.checker={name = "raising_checker"}']
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "raising_checker'.check raised ZeroDivisionError: deep inside the plugin" in err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    events = [json.loads(x) for x in (path.parent / "run" / "events.jsonl").read_text().splitlines()]
    fatal = [e for e in events if e.get("event") == "fatal"][-1]
    assert "in helper" in fatal["traceback"] and "ZeroDivisionError" in fatal["traceback"]
    monkeypatch.setenv("STAR_ENGINE_TRACEBACK", "1")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "in helper" in err and err.splitlines()[-1].startswith("error: plugin")


def test_an_unknown_component_kind_is_a_value_error():
    from star_engine import Registry

    with pytest.raises(ValueError, match="unknown component kind 'hint_formatter'; kinds: task, checker, hint"):
        Registry(autoload=False).create("hint_formatter", "x", {}, "task.hint")
