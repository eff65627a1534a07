"""What reaches a tuner through the core's probe (``star_engine.run.tuning.CoreProbe``): a checker's
graded ``Verdict.score`` as ``ProbeSample.score``, each question's reference solution
(``ReferenceProbe.references``: the task's gold completion, trimmed as the answers are), a
malformed score named as the checker's fault; and B-STaR's ``balance`` tuner in a run, its
``tuning.parquet``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_testkit import scripted_plugin_examples

PLUGIN = textwrap.dedent('''
    import json
    import math

    from star_engine import ReferenceProbe, TuningChoice, UserError, Verdict, hookimpl
    from star_testkit.scripted import ToyTask


    class Graded:
        """Right when the answer is the sum; graded 1 / (1 + |answer - sum|)."""

        def __init__(self, bad: bool = False):
            self.bad = bad

        def check(self, generation, extracted, gold):
            if extracted is None:
                return Verdict(None, False)
            d = abs(int(extracted) - int(gold))
            return Verdict(extracted, d == 0, score=math.nan if self.bad else 1.0 / (1 + d))


    class Spy:
        """Writes what its probe gives (answers, references) to ``out``."""

        def __init__(self, out: str = ""):
            self.out = out

        def tune(self, iteration, questions, probe, seed):
            ids = [q.id for q in questions[:3]]
            groups = probe(0.5, ids, 3)
            refs = probe.references(ids) if isinstance(probe, ReferenceProbe) else None
            rows = [[a.question_id, a.text, a.predicted, a.correct, a.score] for g in groups for a in g]
            with open(self.out, "a") as f:
                f.write(json.dumps({"ids": ids, "answers": rows, "references": refs}) + "\\n")
            return TuningChoice(0.5, [{"temperature": 0.5, "score": 0.0}])


    class NoGold(ToyTask):
        """The toy task without gold completions (as CommonsenseQA has no gold rationales)."""

        def gold_completion(self, ex, direct):
            raise UserError("task 'toy_nogold' has no gold completions")


    @hookimpl
    def register_tasks(register):
        register("toy_nogold", NoGold)


    @hookimpl
    def register_checkers(register):
        register("graded", Graded)


    @hookimpl
    def register_tuners(register):
        register("spy", Spy)
''')


@pytest.fixture
def graded(scripted, monkeypatch, tmp_path):
    (tmp_path / "graded_probe_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_successors.plugin,graded_probe_plugin")


def toml(toy_toml, tuner: str, checker: str = '"graded"', dataset: str = "toy") -> Path:
    path = toy_toml("run")
    text = path.read_text().replace('dataset = "toy"', f'dataset = "{dataset}"\nchecker = {checker}')
    text = text.replace("batch_size = 4\n", f"batch_size = 4\ntemperature = 0.7\nsamples_per_question = 2\n"
                                            f"tuner = {tuner}\n", 1)
    path.write_text(text.replace("iterations = 3", "iterations = 1"))
    return path


def test_the_references_are_trimmed_as_the_answers_are(graded, toy_toml, tmp_path):
    spied = tmp_path / "spied.jsonl"
    path = toml(toy_toml, f'{{ name = "spy", out = "{spied.as_posix()}" }}', dataset="toy_trim")
    assert main(["run", str(path), "--quiet"]) == 0
    (seen,) = [json.loads(line) for line in spied.read_text().splitlines()]
    # toy_trim keeps what comes before the first ".": " 3 plus 4" has no answer left (no score)
    assert len(seen["answers"]) == 9 and all(t.endswith(" plus " + t.split()[-1]) for _, t, *_ in seen["answers"])
    assert all(p is None and not c and s is None for _, _, p, c, s in seen["answers"])
    # the gold completion " add them. The answer is N." cut there too
    assert seen["references"] == [" add them"] * 3


def test_graded_scores_reach_the_tuner(graded, toy_toml, tmp_path):
    spied = tmp_path / "spied.jsonl"
    path = toml(toy_toml, f'{{ name = "spy", out = "{spied.as_posix()}" }}')
    assert main(["run", str(path), "--quiet"]) == 0
    (seen,) = [json.loads(line) for line in spied.read_text().splitlines()]
    gold = {ex.id: ex.answer for ex in scripted_plugin_examples()}
    scores = []
    for q, _text, predicted, correct, score in seen["answers"]:
        d = abs(int(predicted) - int(gold[q]))
        assert score == 1 / (1 + d) and correct == (d == 0)
        scores.append(score)
    assert any(s < 1 for s in scores)  # the toy model is wrong by 1..8 on most questions
    assert seen["references"] == [f" add them. The answer is {gold[q]}." for q in seen["ids"]]


def test_a_score_that_is_not_a_finite_number_is_the_checkers_fault(graded, toy_toml, capsys):
    path = toml(toy_toml, '"toy_tuner"', checker='{ name = "graded", bad = true }')
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "checker 'graded'.check returned" in err and "score: a finite number or None" in err


def test_the_balance_tuner_in_a_run_records_its_choice(graded, toy_toml):
    path = toml(toy_toml, '{ name = "balance", temperatures = [0.2, 0.9], questions = 4, samples = 3 }')
    assert main(["run", str(path), "--quiet"]) == 0
    rows = pq.read_table(path.parent / "run" / "iterations/001/tuning.parquet").to_pylist()
    assert [r["temperature"] for r in rows] == [0.2, 0.9] and sum(r["chosen"] for r in rows) == 1
    for r in rows:
        assert {"score", "threshold", "cap", "selected", "selected_right", "accuracy", "distinct_correct",
                "mean_reward"} <= set(r)
        assert -1.0 <= r["threshold"] < 1.0 and r["cap"] == 64  # 4 questions never select 114 texts
        # every question keeps its reference (reward 1.0 > any τ of the grid): at least 1 right
        assert r["selected_right"] >= 1 and 0 < r["score"] <= 1
        assert 0 < r["mean_reward"] < 1  # graded: the wrong answers' 1 / (1 + d)
    best = max(rows, key=lambda r: r["score"])
    assert best["chosen"]


@pytest.mark.parametrize("reference, rc", [("true", 2), ("false", 0)])
def test_a_task_without_gold_completions_is_refused_before_the_run_for_b_stars_reference(
        graded, toy_toml, capsys, reference, rc):
    path = toml(toy_toml, f'{{ name = "balance", questions = 2, samples = 2, reference = {reference} }}',
                checker='"toy_exact"', dataset="toy_nogold")
    assert main(["validate", str(path)]) == rc
    err = capsys.readouterr().err
    if rc:
        assert len(err.strip().splitlines()) == 1 and "generation.tuner.reference" in err and "no gold" in err
    assert not (path.parent / "run").exists()
