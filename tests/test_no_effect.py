"""Settings silently ignored (issue 31, item 5): a key set (to something other than its default)
that another key makes pointless is an error naming both keys; every table checks its keys
(``task.data`` included, with "did you mean"); and an evaluation split without data is blamed on
``evaluation.splits``, not on a ``--set task.data`` that gave the other splits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_engine.cli import main
from star_engine.config.load import load_experiment
from star_engine.errors import UserError
from star_engine.config.registry import Registry
from star_testkit import REPO, cli

CQA = REPO / "plugins" / "cqa" / "tests" / "data" / "train_sample.jsonl"
FLIP = "--set rationalization.enabled=false"


@pytest.mark.parametrize("sets,message", [
    (["base_training.batch_size=4"], "base_training.batch_size: has no effect when base_training.steps = 0; remove "
                                     "base_training.batch_size, or set base_training.steps (e.g. --set "
                                     "base_training.steps=...) so that it takes effect"),
    (["evaluation.pass_k=1"], "evaluation.pass_k: has no effect when evaluation.samples_per_question = 0 (which is "
                              "1 here: generation.temperature is 0)"),
    (["generation.temperature=0.7", "evaluation.pass_k=1"],
     "evaluation.pass_k: has no effect when evaluation.samples_per_question = 0 (which follows [generation] here: 1 "
     "sample per question)"),
    (["evaluation.sample_temperature=0.7"],
     "evaluation.sample_temperature: has no effect when evaluation.samples_per_question = 0"),
    (["evaluation.top_p=0.9"], "evaluation.top_p: has no effect when evaluation.temperature = 0.0"),
    (["generation.top_p=0.9"], "generation.top_p: has no effect when generation.temperature = 0.0"),
], ids=["base_training", "pass_k", "pass_k_generation", "sample_temperature", "evaluation_top_p",
        "generation_top_p"])
def test_a_feature_s_option_without_the_feature_switched_on_is_an_error_naming_both(scripted, toy_toml, tmp_path,
                                                                                     capsys, sets, message):
    path = toy_toml()
    for command in ("validate", "run"):
        assert main([command, str(path), *[x for s in sets for x in ("--set", s)]]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("sets,notes", [
    (["rationalization.enabled=false", "rationalization.p_show_hint_save=0.5"],
     [f"--set rationalization.p_show_hint_save=0.5: rationalization.p_show_hint_save: has no effect when "
      f"rationalization.enabled = false ({FLIP}); left unused"]),
    (["rationalization.enabled=false", 'task.hint="toy_hint"'],
     [f"task.hint: has no effect when rationalization.enabled = false ({FLIP}); left unused"]),
    (['training.source="gold"', "task.direct=true"],  # TOY_TOML's filters = ["toy_leak"]
     ['task.filters: has no effect when training.source = "gold" (--set training.source="gold"); left unused']),
    (['training.source="gold"', "task.direct=true", "rationalization.p_rationalization=0.5"],
     ['rationalization.p_rationalization: has no effect when training.source = "gold"', "task.filters: "]),
    (["evaluation.samples_per_question=1", "evaluation.pass_k=1"],
     ["evaluation.pass_k: has no effect when evaluation.samples_per_question = 1 (--set "
      "evaluation.samples_per_question=1); left unused"]),
], ids=["p_show_hint_save", "hint", "filters_on_gold", "p_rationalization_on_gold", "pass_k_one"])
def test_an_ablation_in_one_set_leaves_the_settings_it_makes_pointless_unused_with_a_note(
        scripted, toy_toml, capsys, sets, notes):
    path = toy_toml()
    assert main(["validate", str(path), *[x for s in sets for x in ("--set", s)]]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(lines) == len(notes) and all(n in line for n, line in zip(notes, sorted(lines, key=lambda x: x[6:])))


def test_a_copied_file_that_switches_base_training_off_keeps_its_table(scripted, toy_toml, capsys):
    path = toy_toml(extra="\n[base_training]\nsteps = 0\nbatch_size = 4\n")
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    assert "base_training.batch_size: has no effect when base_training.steps = 0; left unused" in err


def test_the_same_keys_with_an_effect_or_at_their_default_are_fine(scripted, toy_toml):
    path = toy_toml()
    ok = [["rationalization.enabled=false"],  # TOY_TOML spells out p_rationalization = 1.0, the default
          ["base_training.steps=5", "base_training.batch_size=4"],
          ["generation.temperature=0.7", "generation.samples_per_question=4", "generation.top_p=0.9",
           "evaluation.pass_k=2"],  # a sampled evaluation, following [generation]
          ["evaluation.temperature=0.5", "evaluation.top_p=0.9"],
          ["generation.top_p=0.9", "evaluation.samples_per_question=4", "evaluation.sample_temperature=0.7"]]
    for sets in ok:
        cfg = load_experiment(path, sets)
        assert cfg.experiment.name == "toy", sets


def test_the_shipped_experiments_set_nothing_without_an_effect():
    reg = Registry(autoload=True, blocked=set())
    for path in sorted((REPO / "experiments").glob("*.toml")):
        load_experiment(path, registry=reg)  # refuses a key without effect (no data is read)


def test_task_data_checks_its_keys(scripted, toy_toml, tmp_path, capsys):
    (tmp_path / "t.txt").write_text("1+2\n")
    path = toy_toml(extra="")
    path.write_text(path.read_text().replace('dataset = "toy"',
                                             'dataset = "toy"\ndata = { train = "t.txt", tset = "t.txt" }'))
    assert main(["validate", str(path), "--set", 'evaluation.splits=["test"]']) == 2
    err = capsys.readouterr().err
    assert (f"{path}: task.data.tset: this run reads no split 'tset' (it reads train and evaluation.splits: test) "
            f"(did you mean 'test'?)") in err
    with pytest.raises(UserError, match=r"task\.data\.dev: this run reads no split 'dev' .*evaluation\.splits: test"):
        load_experiment(path, ['task.data={train = "t.txt", dev = "t.txt"}', 'evaluation.splits=["test"]'])


def test_an_evaluation_split_without_data_is_blamed_on_evaluation_splits(tmp_path):
    """CommonsenseQA reads its splits from files: --set task.data gave train and dev, --set
    evaluation.splits asked for test too; the error is the second --set's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    splits = '--set', 'evaluation.splits=["dev","test"]'
    res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(REPO / "experiments/cqa_rationalize.toml"),
                          "--smoke", "--set", f'task.data={{train = "{CQA}", dev = "{CQA}"}}', *splits],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: --set evaluation.splits=[\"dev\",\"test\"]: evaluation.splits: split 'test': "
                                 "task.data.test: the cqa task reads its data from a file"), res.stderr
    assert "--set task.data=" not in res.stderr


def test_an_option_of_a_task_without_effect(tmp_path):
    """plugins/arithmetic: task.options.n_seed with seed_counts set (experiments/addition.toml)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(REPO / "experiments/addition.toml"),
                          "--smoke", "--set", "task.options.n_seed=50"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "error: --set task.options.n_seed=50: task.options.n_seed: has no effect when seed_counts is set" in \
        res.stderr and "remove n_seed or seed_counts" in res.stderr
    assert not Path(tmp_path / "runs").exists()


def test_no_effect_in_a_process_is_exit_code_2(toy_toml):
    res = cli("validate", str(toy_toml()), "--set", "generation.top_p=0.5")
    assert res.returncode == 2 and "generation.top_p: has no effect" in res.stderr and "Traceback" not in res.stderr
