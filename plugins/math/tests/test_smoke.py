"""``experiments/math_qwen.toml`` as a CPU smoke run: the tiny Llama-style model swapped in by one
``--set`` (with a context that holds the experiment's 512 new tokens), the fixtures as data, as the
other experiments are run (backends/haiku_xmap/tests/test_llama_experiments.py). The run and the
validation need the ``math_verify`` checker, the task's default (star-engine-mathverify)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from star_engine.cli import main
from star_engine.config.registry import Registry

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENT = ROOT / "experiments" / "math_qwen.toml"
DATA = Path(__file__).parent / "data"
TRAIN, DEV = DATA / "math_train_sample.jsonl", DATA / "math500_sample.jsonl"
TINY = ["--set", 'model={backend = "haiku_xmap", architecture = "llama"}']  # llama-tiny, byte tokenizer
FIXTURES = ["--set", f'task.data={{train = "{TRAIN.as_posix()}", dev = "{DEV.as_posix()}"}}']

needs_math_verify = pytest.mark.skipif(
    "math_verify" not in Registry(autoload=True, blocked=set()).components["checker"],
    reason="the math_verify checker (star-engine-mathverify, plugins/mathverify) is not installed")


def test_math_qwen_trains_qwen_on_math_and_evaluates_on_math500():
    cfg = tomllib.loads(EXPERIMENT.read_text())
    task, model = cfg["task"], cfg["model"]
    assert task["dataset"] == "math" and task["checker"] == "math_verify" and task["hint"] == "math_answer"
    assert task["data"]["dev"].endswith("math500/test.jsonl") and cfg["evaluation"]["splits"] == ["dev"]
    assert "math500_file" not in task["options"]  # dev is the MATH-500 file itself; MATH's train split has none
    assert model["architecture"] == "llama" and model["checkpoint_path"] and model["tokenizer"] == "hf"
    from star_haiku_xmap.model.config import PRESETS

    assert PRESETS[model["preset"]].architecture == "llama" and model["preset"].startswith("qwen2.5")
    assert cfg["generation"]["max_new_tokens"] < PRESETS[model["preset"]].n_ctx
    assert cfg["generation"]["max_new_tokens"] < PRESETS["llama-tiny"].n_ctx  # the tiny override's context holds it


@needs_math_verify
def test_math_qwen_validates_with_the_tiny_override(capsys):
    rc = main(["validate", str(EXPERIMENT), "--limit", "8", *TINY, *FIXTURES])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "task math: train=6, dev=5" in out and "backend haiku_xmap" in out


@needs_math_verify
def test_math_qwen_smoke_run(tmp_path):
    run = tmp_path / "run"
    rc = main(["run", str(EXPERIMENT), "--limit", "8", "--quiet", *TINY, *FIXTURES,
               "--set", "generation.max_new_tokens=48",  # a random model writes to the limit: keep it short
               "--set", "experiment.iterations=1", "--set", f'experiment.output_dir="{run.as_posix()}"'])
    assert rc == 0
    config = json.loads((run / "config.json").read_text())
    assert config["task"]["checker"]["name"] == "math_verify" and config["task"]["hint"] == {"name": "math_answer"}
    backend = json.loads((run / "manifest.json").read_text())["backend"]
    assert backend["model"]["architecture"] == "llama" and backend["tokenizer"]["kind"] == "byte"
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert set(metrics["iteration"]) == {0, 1}
    dev = metrics[metrics["split"] == "dev"]
    assert set(dev["class"]) == {"all", "algebra", "intermediate_algebra", "number_theory", "prealgebra",
                                 "precalculus"}
    evaluated = pd.read_parquet(run / "iterations" / "001" / "eval_dev.parquet")
    assert sorted(evaluated["question_id"]) == sorted(e["unique_id"] for e in map(json.loads, DEV.open()))
    assert set(evaluated["checker"]) == {"math_verify"}
    generated = pd.read_parquet(run / "iterations" / "001" / "generated.parquet")
    assert len(generated) == 6  # every train problem (fewer than --limit)
    assert (run / "report.md").is_file()


@needs_math_verify
def test_gold_completions_are_right_under_math_verify_and_others_wrong():
    """The task's completions (worked and direct) of every fixture problem, judged by the default
    checker as the core builds it: right against their own gold, wrong against another problem's."""
    reg = Registry(autoload=True, blocked=set())
    task = reg.create("task", "math", {}, "task.dataset", "task.options")
    checker = reg.create("checker", task.default_checker, {}, "task.checker")
    examples = task.load("train", str(TRAIN)) + task.load("dev", str(DEV))
    try:
        for i, ex in enumerate(examples):
            other = examples[(i + 1) % len(examples)]
            for direct in (False, True):
                done = task.trim(task.gold_completion(ex, direct))
                assert checker.check(done, task.extract(done), ex.answer).correct, (ex.id, direct)
                assert not checker.check(done, task.extract(done), other.answer).correct, (ex.id, other.id)
    finally:
        checker.close()
