"""``experiments/reasoning_gym.toml`` as a CPU smoke run: the file unchanged but for the tiny
model, eight questions a split, one iteration and a few training steps; and a bad dataset name
through the command line (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("reasoning_gym")  # installed by requirements.txt: these tests run

from star_engine.cli import main  # noqa: E402
from star_rgym import gold  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENT = ROOT / "experiments" / "reasoning_gym.toml"
TINY = ["--set", 'model={backend = "haiku_xmap"}']  # the whole [model] table: tiny preset, byte tokenizer
SHORT = ["--set", "experiment.iterations=1", "--set", "base_training.steps=4",
         "--set", 'training.schedule={name = "steady_grow", start_steps = 2, add_steps = 0}']


def test_reasoning_gym_smoke_run_with_the_tiny_model(tmp_path):
    run = tmp_path / "run"
    rc = main(["run", str(EXPERIMENT), "--limit", "8", "--quiet", *TINY, *SHORT,
               "--set", f'experiment.output_dir="{run}"'])
    assert rc == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["task"]["dataset"] == "reasoning_gym" and cfg["task"]["options"]["name"] == "spell_backward"
    assert cfg["task"]["checker"] == {"name": "reasoning_gym_score"}
    assert cfg["task"]["hint"] == {"name": "reasoning_gym_answer"}
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert set(metrics["iteration"]) == {0, 1} and "dev" in set(metrics["split"])
    dev = pd.read_parquet(run / "iterations" / "001" / "eval_dev.parquet")
    assert len(dev) == 8 and set(dev["checker"]) == {"reasoning_gym_score"}
    assert set(dev["class"]) <= {"3", "4", "5", "6"}  # class_field = "word_len"
    refs = [gold.decode(g) for g in dev["gold"]]
    assert {r.name for r in refs} == {"spell_backward"} and len({r.index for r in refs}) == 8
    generated = pd.read_parquet(run / "iterations" / "001" / "generated.parquet")
    assert len(generated) == 8 and set(generated["checker"]) == {"reasoning_gym_score"}
    assert (run / "report.md").is_file()


def test_unknown_dataset_name_on_the_command_line(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["validate", str(EXPERIMENT), *TINY, "--set", 'task.options.name="chain_sums"',
               "--set", f'experiment.output_dir="{run}"'])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: --set task.options.name=\"chain_sums\": task.options.name: "
                          "unknown reasoning-gym dataset 'chain_sums'; close names: chain_sum, decimal_chain_sum")
    assert not run.exists()
