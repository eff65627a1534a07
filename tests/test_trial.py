"""``validate`` (and ``run``, before it writes anything) tries the checker on the task's own gold
completions: a checker that judges every one wrong, or whose task extracts nothing from them, is
one line naming ``task.checker`` with an example (``star_engine.run.trial``)."""

from __future__ import annotations

import pytest

from star_engine.cli import main


@pytest.fixture
def successors(scripted, monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_successors.plugin")


def test_a_checker_that_judges_the_gold_answers_wrong_is_named_before_the_run(successors, toy_toml, tmp_path,
                                                                             capsys):
    path = toy_toml()
    path.write_text(path.read_text().replace('dataset = "toy"',
                                             'dataset = "toy"\nchecker = { name = "random_reward", p = 0.0 }'))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "task.checker" in err and "judges every one wrong" in err, err
        assert "gold answer" in err and "add them. The answer is" in err  # one example, shown
    assert not (tmp_path / "run").exists()


def test_the_task_s_own_checker_on_its_gold_completions_is_fine(successors, toy_toml, capsys):
    path = toy_toml()
    path.write_text(path.read_text().replace('dataset = "toy"',
                                             'dataset = "toy"\nchecker = { name = "random_reward", p = 1.0 }'))
    assert main(["validate", str(path)]) == 0
    assert main(["validate", str(toy_toml(name="plain.toml"))]) == 0


REFUSING_HINT = '''
from star_engine import UserError, hookimpl


class OddOnly:
    """A hint formatter for odd answers only: it refuses the others, as a formatter for letter
    choices refuses a question without choices."""

    def context(self, task, example):
        if int(example.answer) % 2 == 0:
            raise UserError(f"answer {example.answer!r} is not odd")
        return task.context(example) + f" (hint: {example.answer})"


@hookimpl
def register_hint_formatters(register):
    register("odd_only", OddOnly)
'''


def test_a_hint_formatter_that_refuses_the_data_is_named_with_the_question(scripted, toy_toml, tmp_path, capsys,
                                                                          monkeypatch):
    """The hint formatter writes its context for a few training questions at validate: a refusal
    is one line naming task.hint, the split and the question; nothing is written (issue #43)."""
    (tmp_path / "refusing_hint.py").write_text(REFUSING_HINT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,refusing_hint")
    path = toy_toml()
    path.write_text(path.read_text().replace('dataset = "toy"', 'dataset = "toy"\nhint = "odd_only"'))
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "task.hint: cannot write the prompt of train question" in err, err
        assert "is not odd" in err
    assert not (tmp_path / "run").exists()
    off = ["--set", "rationalization.enabled=false"]  # no rationalization: the hint is never written
    assert main(["validate", str(path), *off]) == 0
