"""An iteration that keeps nothing to train on is not silent: a ``nothing_kept`` warning event
and a line under the run summary; ``experiment.stop_when_nothing_kept`` ends the run there."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from star_engine.cli import main

REWARD_NOTHING = 'reward = { name = "random_reward", p = 0.0 }\n'


def toy(toy_toml, out: str, experiment: str = "") -> Path:
    path = toy_toml(out, name=f"{out}.toml")
    text = path.read_text().replace('dataset = "toy"', 'dataset = "toy"\n' + REWARD_NOTHING)
    text = text.replace("enabled = true\np_rationalization = 1.0\n", "enabled = false\n")
    text = text.replace("iterations = 3\n", "iterations = 3\n" + experiment)
    path.write_text(text)
    return path


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def test_an_iteration_that_keeps_nothing_is_a_warning_and_a_summary_line(scripted, monkeypatch, toy_toml,
                                                                         tmp_path, capsys):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_successors.plugin")
    path = toy(toy_toml, "run")
    assert main(["run", str(path)]) == 0
    run = tmp_path / "run"
    warned = [e["iteration"] for e in events(run) if e.get("event") == "nothing_kept"]
    assert warned == [1, 2, 3]
    out = capsys.readouterr()
    assert "kept nothing to train on in iterations 1, 2, 3" in " ".join((out.out + out.err).split())  # wrapped
    train = [r for r in pq.read_table(run / "metrics.parquet").to_pylist() if r["split"] == "train"]
    assert all(r["kept"] == 0 and r["train_steps"] == 0 for r in train)


def test_stop_when_nothing_kept_ends_the_run_at_the_first(scripted, monkeypatch, toy_toml, tmp_path):
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,star_successors.plugin")
    path = toy(toy_toml, "stop", "stop_when_nothing_kept = true\n")
    assert main(["run", str(path), "--quiet"]) == 0
    run = tmp_path / "stop"
    assert [e["iteration"] for e in events(run) if e.get("event") == "stop_nothing_kept"] == [1]
    assert not (run / "iterations/002").exists()
    assert {r["iteration"] for r in pq.read_table(run / "metrics.parquet").to_pylist()} == {0, 1}
