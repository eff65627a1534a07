"""``[training] adapter`` / ``[base_training] adapter``: the core refuses a table its backend cannot
train (no ``Backend.adapter_kinds``, or a kind it does not list), one line naming the key, exit 2,
nothing written; an empty table (the default) is full fine-tuning and reaches the backend as None."""

from __future__ import annotations

import pytest

from star_testkit import TOY_TOML
from star_engine.cli import main
from star_engine.config.load import load_experiment


def _file(tmp_path, section: str, table: str):
    text = TOY_TOML.format(out=(tmp_path / "run").as_posix())
    if f"[{section}]" not in text:  # the toy file has no [base_training]: a section of its own
        text = text.replace("[model]", f"[{section}]\n\n[model]", 1)
    path = tmp_path / "toy.toml"
    path.write_text(text.replace(f"[{section}]\n", f"[{section}]\nadapter = {table}\n", 1))
    return path


@pytest.mark.parametrize("section", ["training", "base_training"])
def test_a_table_beside_a_backend_without_adapters_is_refused(scripted, tmp_path, capsys, section):
    path = _file(tmp_path, section, '{ kind = "lora", rank = 8 }')
    for command in ("validate", "run"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{section}.adapter: backend 'scripted' trains no adapters" in err and err.count("\n") == 1
        assert str(path) in err
    assert not (tmp_path / "run").exists()


def test_a_kind_the_backend_does_not_list_is_refused(scripted, tmp_path, capsys, monkeypatch):
    from star_testkit import scripted as backend_module

    monkeypatch.setattr(backend_module.ScriptedBackend, "adapter_kinds", ("lora",), raising=False)
    path = _file(tmp_path, "training", '{ kind = "dora" }')
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "training.adapter.kind: must be one of ['lora'], got 'dora'" in err and err.count("\n") == 1


def test_no_table_is_full_fine_tuning_and_a_table_reaches_the_backend(scripted, tmp_path, monkeypatch):
    from star_testkit import scripted as backend_module

    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()))
    cfg = load_experiment(path)
    assert cfg.training.adapter == {} and cfg.training.train_spec(3, 0).adapter is None
    monkeypatch.setattr(backend_module.ScriptedBackend, "adapter_kinds", ("lora",), raising=False)
    cfg = load_experiment(_file(tmp_path, "training", '{ kind = "lora", rank = 8 }'))
    assert cfg.training.train_spec(3, 0).adapter == {"kind": "lora", "rank": 8}
    assert cfg.base_training.train_spec(3, 0).adapter is None


def test_a_run_written_before_config_json_completed_its_adapter_resumes(tmp_path):
    """config.json now records an adapter with its declaration's defaults (issue #40); a run
    directory whose config.json holds the table as written resumes when the new values of the
    keys it lacks are those defaults, and is a different configuration when they are not."""
    import json

    from star_engine.errors import UserError
    from star_engine.rundir.layout import inspect

    root = tmp_path / "run"
    root.mkdir()
    old = {"experiment": {"output_dir": str(root), "smoke": False}, "training": {"adapter": {"kind": "lora", "rank": 8}}}
    (root / "config.json").write_text(json.dumps(old))
    defaults = {"adapter.lora": {"rank": 16, "alpha": None, "targets": None, "rslora": False}}
    new = {"experiment": {"output_dir": str(root), "smoke": False},
           "training": {"adapter": {"kind": "lora", "rank": 8, "alpha": None, "targets": None, "rslora": False}}}
    assert inspect(new, defaults).resume
    new["training"]["adapter"]["rslora"] = True
    with pytest.raises(UserError, match="changed: training.adapter.rslora"):
        inspect(new, defaults)
