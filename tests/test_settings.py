"""The typed configuration (``star_engine.config.load.Config``; its sections: ``star_engine.config.settings``):
the schema is derived from its sections, the objects are frozen and read by attribute, and turning the resolved
configuration into them and back is exact, so ``config.json`` is what it was."""

from __future__ import annotations

import dataclasses
import typing
import json
from pathlib import Path

import pytest

from star_testkit import REPO
from star_engine.api import GenSpec
from star_engine.config.load import SCHEMA, Config, load_experiment
from star_engine.errors import UserError
from star_engine.run.experiment import build
from star_engine.config.registry import Registry
from star_testkit.scripted import ToyOptimizer


def test_the_schema_is_the_sections_fields():
    hints = typing.get_type_hints(Config)
    sections = {f.name: hints[f.name] for f in dataclasses.fields(Config)}
    assert list(SCHEMA) == [*sections, "sweep"]  # [sweep]: many runs' values, not a section of one (sweep.py)
    for name, section in sections.items():
        if name != "model":  # a plugin's table
            assert list(SCHEMA[name]) == [f.name for f in dataclasses.fields(section)]
    for section in ("base_training", "training"):  # the backend's table (Backend.optimizer_table)
        assert SCHEMA[section]["optimizer"].type is dict


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_experiments_round_trip(path: Path):
    cfg = load_experiment(path)
    config = Config.from_dict(cfg)
    assert json.dumps(config.as_dict()) == json.dumps(cfg)  # same keys, order, types and values
    assert config.training.optimizer == cfg["training"]["optimizer"]
    assert config.evaluation.splits == tuple(cfg["evaluation"]["splits"])


def test_build_makes_the_typed_config_once(scripted, toy_toml):
    cfg = load_experiment(toy_toml(), ["training.optimizer.lr=3e-4"])
    exp = build(cfg, Registry(), load_data=False)
    assert exp.config.experiment.seed == 7 and exp.config.generation.chunk_size == 5
    assert exp.config.task.checker == {"name": "toy_exact"} == exp.config.as_dict()["task"]["checker"]  # the task's default
    spec = exp.config.training.train_spec(3, 11)
    assert (spec.steps, spec.seed, spec.batch_size, spec.packing) == (3, 11, 8, "segments")
    assert spec.optimizer == {**{k: f.default for k, f in ToyOptimizer.schema().items()}, "lr": 3e-4}
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.config.training.batch_size = 2  # type: ignore[misc]
    plain = exp.config.as_dict()
    plain["experiment"]["seed"] = 0  # a copy: the configuration is not changed through it
    assert exp.config.experiment.seed == 7 and exp.config.as_dict()["experiment"]["seed"] == 7
    stop = ("\n\n",)  # the specs the sections make for the backend
    g, ev = exp.config.generation, exp.config.evaluation
    assert g.gen_spec(stop) == GenSpec(32, 0.0, 1.0, stop, 4) == ev.gen_spec(g, stop)  # [evaluation] 0: [generation]'s
    ev = dataclasses.replace(ev, max_new_tokens=20, temperature=0.5, sample_temperature=0.9, top_p=0.8)
    assert ev.gen_spec(g, stop) == GenSpec(20, 0.5, 0.8, stop, 4)
    assert ev.sampled_spec(g, stop) == GenSpec(20, 0.9, 1.0, stop, 4)


def test_the_optimizer_tables_are_the_backends(scripted, toy_toml, monkeypatch):
    """``[*.optimizer]`` is checked and completed by the backend's ``optimizer_table`` when the
    experiment is loaded, with the file's rules and messages (the ``--set`` that gave a value
    named); a backend without one gets the tables as written."""
    from star_testkit.scripted import ScriptedBackend

    cfg = load_experiment(toy_toml(), ["training.optimizer.lr=3e-4"])
    defaults = {k: f.default for k, f in ToyOptimizer.schema().items()}
    assert cfg["training"]["optimizer"] == {**defaults, "lr": 3e-4} and cfg["base_training"]["optimizer"] == defaults
    for sets, message in ((["training.optimizer.lrr=1"],
                           "--set training.optimizer.lrr=1: unknown key 'training.optimizer.lrr' (did you mean 'lr'?)"),
                          (['base_training.optimizer.schedule="step"'],
                           "--set base_training.optimizer.schedule=\"step\": base_training.optimizer.schedule: "
                           "must be one of constant, linear, cosine, got 'step'")):
        with pytest.raises(UserError) as err:
            load_experiment(toy_toml(), sets)
        assert str(err.value).startswith(message), str(err.value)
    monkeypatch.delattr(ScriptedBackend, "optimizer_table")
    cfg = load_experiment(toy_toml(), ["training.optimizer.lrr=1"])
    assert cfg["training"]["optimizer"] == {"lrr": 1} and cfg["base_training"]["optimizer"] == {}
