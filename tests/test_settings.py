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
    config = load_experiment(path)  # the typed Config, the optimizer tables as the backend's objects
    assert isinstance(config, Config)
    cfg = config.as_dict()  # config.json
    again = Config.from_dict(json.loads(json.dumps(cfg)))
    assert json.dumps(again.as_dict()) == json.dumps(cfg)  # same keys, order, types and values
    opt = config.training.optimizer  # the backend's object (AdamW for haiku_xmap)
    assert not isinstance(opt, dict) and opt.as_dict() == cfg["training"]["optimizer"]
    assert config.evaluation.splits == tuple(cfg["evaluation"]["splits"])


def test_build_makes_the_typed_config_once(scripted, toy_toml):
    cfg = load_experiment(toy_toml(), ["training.optimizer.lr=3e-4"])
    exp = build(cfg, Registry(), load_data=False)
    assert exp.config.experiment.seed == 7 and exp.config.generation.chunk_size == 5
    assert exp.config.task.checker == {"name": "toy_exact"} == exp.config.as_dict()["task"]["checker"]  # the task's default
    spec = exp.config.training.train_spec(3, 11)
    assert (spec.steps, spec.seed, spec.batch_size, spec.packing) == (3, 11, 8, "segments")
    assert spec.optimizer == ToyOptimizer(lr=3e-4)  # the backend's object, built once at load
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
    assert cfg.training.optimizer == ToyOptimizer(lr=3e-4) and cfg.base_training.optimizer == ToyOptimizer()
    assert cfg.training.train_spec(3, 0).optimizer is cfg.training.optimizer  # the object travels, not a dict
    defaults = {k: f.default for k, f in ToyOptimizer.schema().items()}
    assert cfg.as_dict()["training"]["optimizer"] == {**defaults, "lr": 3e-4}  # config.json: the completed table
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
    assert cfg.training.optimizer == {"lrr": 1} and cfg.base_training.optimizer == {}


def test_a_backend_reading_its_optimizer_as_a_table_still_works_warned(scripted, toy_toml):
    """Until 0.2 a job's ``optimizer`` (now the backend's object) and ``load_experiment``'s result
    (now the typed Config) still read as the tables they were, with a DeprecationWarning."""
    cfg = load_experiment(toy_toml(), ["training.optimizer.lr=3e-4"])
    spec = cfg.training.train_spec(3, 0)
    with pytest.warns(DeprecationWarning, match="ToyOptimizer read as a table"):
        assert spec.optimizer["lr"] == 3e-4 and spec.optimizer.get("b1") == 0.9
    with pytest.warns(DeprecationWarning, match="Config read as a table"):
        assert cfg["training"]["optimizer"]["lr"] == 3e-4 and dict(cfg["experiment"])["seed"] == 7
    with pytest.warns(DeprecationWarning):
        assert {**spec.optimizer} == spec.optimizer.as_dict()


def test_an_error_gets_its_origin_once(toy_toml):
    from star_engine.config.load import Origins

    path = toy_toml()
    with pytest.raises(UserError) as err:
        load_experiment(path, ["generation.batch_size=0"])
    shown = str(err.value)
    assert shown.startswith("--set generation.batch_size=0: generation.batch_size") and err.value.key
    assert Origins(path, ["generation.batch_size=0"]).place(err.value) is err.value  # placed already: as is
    assert shown.count("--set generation.batch_size=0") == 1
