"""The Llama-family experiments (``experiments/gsm8k_qwen.toml``, ``cqa_llama.toml``)
as CPU smoke runs: the tiny Llama-style model swapped in by one ``--set``, as the
GPT-J experiments are (test_plan.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from star_engine.cli import main

ROOT = Path(__file__).resolve().parents[3]
CQA = ROOT / "plugins" / "cqa" / "tests" / "data" / "train_sample.jsonl"
GSM8K = ROOT / "plugins" / "gsm8k" / "tests" / "data" / "train_sample.jsonl"
TINY = ["--set", 'model={backend = "haiku_xmap", architecture = "llama"}']  # llama-tiny, byte tokenizer
FILES = {"gsm8k_qwen.toml": ("gsm8k.toml", GSM8K, "test"), "cqa_llama.toml": ("cqa.toml", CQA, "dev")}


@pytest.mark.parametrize("name", sorted(FILES))
def test_llama_experiments_name_a_checkpoint_and_keep_the_gptj_loop(name):
    cfg = tomllib.loads((ROOT / "experiments" / name).read_text())
    gptj = tomllib.loads((ROOT / "experiments" / FILES[name][0]).read_text())
    m = cfg["model"]
    assert m["architecture"] == "llama" and m["checkpoint_path"] and m["tokenizer"] == "hf"
    from star_haiku_xmap.model.config import PRESETS

    assert PRESETS[m["preset"]].architecture == "llama"
    # Only [model] differs, and gsm8k_qwen's checker: math_verify, with lm-eval's two GSM8K scores beside it.
    if name == "gsm8k_qwen.toml":
        assert cfg["task"].pop("checker") == "math_verify" and gptj["task"].pop("checker") == "numeric"
        assert cfg["evaluation"].pop("checkers") == ["math_verify", "gsm8k_strict", "gsm8k_flexible"]
    for table in ("task", "generation", "rationalization", "training", "evaluation"):
        assert cfg[table] == gptj[table], (name, table)


@pytest.mark.parametrize("name", sorted(FILES))
def test_llama_experiments_validate_with_the_tiny_override(name, capsys):
    _, data, split = FILES[name]
    rc = main(["validate", str(ROOT / "experiments" / name), "--limit", "8", *TINY,
               "--set", f'task.data={{train = "{data}", {split} = "{data}"}}'])
    assert rc == 0, capsys.readouterr().err
    assert "backend haiku_xmap" in capsys.readouterr().out


def test_gsm8k_qwen_smoke_run(tmp_path):
    run = tmp_path / "run"
    rc = main(["run", str(ROOT / "experiments" / "gsm8k_qwen.toml"), "--limit", "8", "--quiet", *TINY,
               "--set", "experiment.iterations=1", "--set", f'experiment.output_dir="{run}"',
               "--set", f'task.data={{train = "{GSM8K}", test = "{GSM8K}"}}'])
    assert rc == 0
    backend = json.loads((run / "manifest.json").read_text())["backend"]
    assert backend["model"]["architecture"] == "llama" and backend["model"]["n_kv_head"] == 2
    assert backend["tokenizer"]["kind"] == "byte"
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert set(metrics["iteration"]) == {0, 1} and "test" in set(metrics["split"])
    test_rows = metrics[(metrics["split"] == "test") & (metrics["class"] == "all")]
    assert len(test_rows) == 2
    for n, checkers in zip(test_rows["n"], test_rows["checkers"]):  # each verdict beside the task's checker's
        assert [c["checker"] for c in checkers] == ["math_verify", "gsm8k_strict", "gsm8k_flexible"]
        assert all(c["n"] == n == 3 for c in checkers)  # the fixture's 3 questions
    assert (run / "iterations" / "001" / "generated.parquet").is_file()
