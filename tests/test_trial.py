"""``validate`` (and ``run``, before it writes anything) tries the checker on the task's own gold
completions: a checker that judges every one wrong, or whose task extracts nothing from them, is
one line naming ``task.checker`` with an example (``star_engine.trial``)."""

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
