"""``--smoke`` (issue 31, item 2): the backend's default model, a few questions, one iteration, and
every stage runs, the training stage included: when nothing was kept it trains on the task's gold
completions, labelled so in metrics.parquet (``trained_on``), the events and ``smoke_gold.parquet``.
(``tests/test_readme_smoke.py`` runs the README's smoke command on the real backend.)"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from star_engine.config import smoke
from star_engine.cli import main
from star_engine.config.load import load_experiment
from star_engine.errors import UserError
from star_testkit import cli
from star_testkit.scripted import ToyTask

NOTHING_RIGHT = ["--set", "model.easy_mod=1000003", "--set", "rationalization.enabled=false"]


def _rows(path):
    return pq.read_table(path).to_pylist()


def _train_row(run):
    return next(m for m in _rows(run / "metrics.parquet") if (m["iteration"], m["split"], m["class"]) == (1, "train",
                                                                                                          "all"))


def test_smoke_settings_and_set_wins(scripted, toy_toml, tmp_path):
    path = toy_toml(extra='\n[base_training]\nsteps = 100\n')
    cfg = load_experiment(path, ["model.easy_mod=5"], smoke=True).as_dict()
    exp = cfg["experiment"]
    assert exp["smoke"] is True and exp["iterations"] == 1 and exp["limit"] == smoke.LIMIT
    assert exp["output_dir"] == (tmp_path / "run_smoke").as_posix()  # never the real run's folder
    assert cfg["model"] == {"backend": "scripted", "easy_mod": 5}  # the file's [model] replaced, --set on top
    assert cfg["base_training"]["steps"] == smoke.STEPS
    # --set and --limit still win; experiment.smoke = true in the file (or a --set) asks for the same.
    cfg = load_experiment(path, ["experiment.iterations=2", f'experiment.output_dir="{tmp_path / "x"}"',
                                 "base_training.steps=50"], limit=3, smoke=True).as_dict()
    assert (cfg["experiment"]["iterations"], cfg["experiment"]["limit"], cfg["base_training"]["steps"]) == (2, 3, 50)
    assert cfg["experiment"]["output_dir"] == str(tmp_path / "x")
    assert load_experiment(path, ["experiment.smoke=true"]).as_dict()["experiment"]["iterations"] == 1
    assert load_experiment(path).as_dict()["experiment"]["smoke"] is False
    assert [smoke.steps(n) for n in (0, 1, 3, 4, 500)] == [1, 1, 3, 4, 4]


def test_nothing_kept_trains_on_the_gold_completions_and_says_so(scripted, toy_toml, tmp_path):
    assert main(["run", str(toy_toml()), "--quiet", "--smoke", *NOTHING_RIGHT]) == 0
    run = tmp_path / "run_smoke"
    assert not (tmp_path / "run").exists()
    assert json.loads((run / "config.json").read_text())["experiment"]["smoke"] is True
    generated = _rows(run / "iterations/001/generated.parquet")
    assert len(generated) == smoke.LIMIT and not any(r["correct"] for r in generated)
    assert not any(r["kept"] for r in _rows(run / "iterations/001/rationales.parquet"))  # kept stays honest
    row = _train_row(run)
    assert row["kept"] == 0 and row["trained_on"] == "gold_fallback" and 1 <= row["train_steps"] <= smoke.STEPS
    gold = _rows(run / "iterations/001/smoke_gold.parquet")
    task = ToyTask()
    questions = {e.id: e for e in task.load("train", None)}
    assert [r["question_id"] for r in gold] == [r["question_id"] for r in generated]
    assert all(r["checker"] == "gold" and r["rationale"] == task.gold_completion(questions[r["question_id"]], False)
               for r in gold)
    learned = json.loads((run / "iterations/001/model/model.json").read_text())["learned"]
    assert sorted(learned.values()) == sorted(r["rationale"] for r in gold)  # what the training stage trained on
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    warned = [e for e in events if e["event"] == "smoke_gold_fallback"]
    assert len(warned) == 1 and warned[0]["level"] == "warning" and warned[0]["examples"] == len(gold)
    # Without --smoke the same run trains on nothing: 0 steps (what the fallback is for).
    path = toy_toml(out="plain", name="plain.toml")
    assert main(["run", str(path), "--quiet", "--limit", "8", "--set", "experiment.iterations=1", *NOTHING_RIGHT]) == 0
    plain = _train_row(tmp_path / "plain")
    assert (plain["train_steps"], plain["trained_on"]) == (0, None)


def test_what_was_kept_is_trained_on_for_at_most_a_few_steps(scripted, toy_toml, tmp_path):
    schedule = 'training.schedule={name = "toy_linear", per_iteration = 100}'
    assert main(["run", str(toy_toml()), "--quiet", "--smoke", "--set", schedule]) == 0
    row = _train_row(tmp_path / "run_smoke")
    assert row["kept"] > 0 and row["trained_on"] == "kept" and row["train_steps"] == smoke.STEPS
    assert not (tmp_path / "run_smoke/iterations/001/smoke_gold.parquet").exists()


def test_a_task_without_gold_completions_says_why_the_smoke_run_cannot_train(scripted, toy_toml, tmp_path,
                                                                           monkeypatch, capsys):
    def none(self, example, direct):
        raise UserError("toy: no gold completions")

    monkeypatch.setattr(ToyTask, "gold_completion", none)
    assert main(["run", str(toy_toml()), "--quiet", "--smoke", *NOTHING_RIGHT]) == 2
    err = capsys.readouterr().err
    assert "--smoke: iteration 1 kept nothing, and the task has no gold completions to train on instead" in err
    assert "toy: no gold completions" in err


def test_validate_smoke_in_a_process(toy_toml, tmp_path):
    res = cli("validate", str(toy_toml()), "--smoke")
    assert res.returncode == 0, res.stderr
    assert f"run directory {(tmp_path / 'run_smoke').as_posix()}: new" in res.stdout and "train=8, dev=8" in res.stdout
    assert not (tmp_path / "run_smoke").exists()  # validate writes nothing
