"""The run directory names the checker and hint formatter that ran, also when the
experiment leaves them to the task's defaults: ``config.json`` (the resolved
configuration) records their names, every evaluation file has a ``checker`` column,
and a run directory written before either was recorded still resumes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq

from star_engine.cli import main


def config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def test_defaults_are_recorded_by_name(scripted, toy_toml):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    run = path.parent / "run"
    task = config(run)["task"]
    assert task["checker"] == {"name": "toy_exact"} and task["hint"] == {"name": "toy_hint"}
    for n in (0, 1):
        evals = pq.read_table(run / f"iterations/{n:03d}/eval_dev.parquet").to_pylist()
        assert evals and {r["checker"] for r in evals} == {"toy_exact"}
    generated = pq.read_table(run / "iterations/001/generated.parquet").to_pylist()
    assert {r["checker"] for r in generated} == {"toy_exact"}


def test_a_named_checker_is_recorded_with_its_options_and_an_unused_hint_is_not(scripted, toy_toml):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1", "--set",
                 "rationalization.enabled=false", "--set", 'task.checker={name = "toy_exact"}']) == 0
    task = config(path.parent / "run")["task"]
    assert task["checker"] == {"name": "toy_exact"} and task["hint"] == {}  # no hint is used


def _rewrite(run: Path, rel: str, data: bytes) -> None:
    """Replace an artifact and its manifest record, as an older star-engine would have left it."""
    (run / rel).write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["artifacts"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_a_run_directory_from_before_the_names_were_recorded_resumes(scripted, toy_toml, capsys):
    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=2"]) == 0
    run = path.parent / "run"
    old = config(run)
    old["task"]["checker"], old["task"]["hint"] = {}, {}  # config.json as it was written before
    (run / "config.json").write_text(json.dumps(old))
    rel = "iterations/001/eval_dev.parquet"
    table = pq.read_table(run / rel)
    older = table.drop_columns(["checker"]).replace_schema_metadata(table.schema.metadata)
    pq.write_table(older, run / "old.parquet")
    _rewrite(run, rel, (run / "old.parquet").read_bytes())
    (run / "old.parquet").unlink()
    # Another checker than the default the old run used is still a different configuration.
    assert main(["run", str(path), "--quiet", "--set", 'task.checker={name = "toy_exact", strip = false}']) == 2
    assert "holds a run of a different configuration (changed: task.checker.name, task.checker.strip)" in capsys.readouterr().err
    # The defaults it stood for are the same configuration: the run resumes and finishes.
    assert main(["run", str(path), "--quiet"]) == 0
    assert "checker" not in pq.read_table(run / rel).column_names  # finished work is not redone
    assert {r["checker"] for r in pq.read_table(run / "iterations/003/eval_dev.parquet").to_pylist()} == {"toy_exact"}
    assert config(run)["task"]["checker"] == {"name": "toy_exact"}
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    assert {r["iteration"] for r in metrics} == {0, 1, 2, 3} and (run / "report.md").exists()


def test_a_plugins_changed_default_is_a_changed_configuration(scripted, toy_toml, capsys, monkeypatch):
    """The manifest records each component's options as it ran, defaults included
    (``component_options``); a resumed run whose installed plugin has another default for an
    option the experiment leaves out is refused, naming the option and the value the run used;
    written out, the run resumes. An option the run's plugin did not have yet is not a change."""
    from star_testkit import scripted as plugin

    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    run = path.parent / "run"
    ran = json.loads((run / "manifest.json").read_text())["component_options"]
    assert ran["task.checker"] == {"strip": True} and "training.schedule" in ran and "task.options" in ran
    assert config(run)["task"]["checker"] == {"name": "toy_exact"}  # config.json: as written (resolved names)
    monkeypatch.setattr(plugin.ToyExact.__init__, "__defaults__", (False,))
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=2"]) == 2
    err = capsys.readouterr().err
    assert "(changed: task.checker.strip)" in err and err.count("\n") == 1, err
    assert "task.checker.strip is a default of the installed plugin, not the one the run used (true): write " \
           "task.checker.strip = true to resume as it ran" in err
    assert not (run / "iterations" / "002").exists()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=2",
                 "--set", 'task.checker={name = "toy_exact", strip = true}']) == 0
    assert (run / "iterations" / "002").is_dir()

    class Newer(plugin.ToyExact):  # a later version with one more option, at its default
        def __init__(self, strip: bool = True, casefold: bool = False):
            super().__init__(strip)

    monkeypatch.setattr(plugin.ToyExact.__init__, "__defaults__", (True,))
    monkeypatch.setattr(plugin, "ToyExact", Newer)
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=3"]) == 0, capsys.readouterr().err
    after = json.loads((run / "manifest.json").read_text())["component_options"]
    assert after["task.checker"] == {"strip": True, "casefold": False}
