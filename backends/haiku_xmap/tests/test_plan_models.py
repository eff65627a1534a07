"""``star-engine plan --models`` (plan_models.py): the Llama-family table of
docs/models.md, extrapolated from two shallow compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from star_engine.cli import main
from star_haiku_xmap.model.config import PRESETS
from star_haiku_xmap.model.network import param_count
from star_haiku_xmap.plan.models import FULL, LORA, MODELS, extrapolate


def test_extrapolation_is_linear_in_layers():
    shallow = {"argument": 100, "output": 10, "alias": 10, "temp": 50, "peak": 150}
    deep = {"argument": 140, "output": 10, "alias": 10, "temp": 70, "peak": 210}
    got = extrapolate(shallow, deep, (2, 4), 24)
    assert got["argument"] == 140 + 20 * 20 and got["temp"] == 70 + 10 * 20 and got["layers"] == 24
    assert got["peak"] == got["argument"] + got["temp"]


def test_presets_match_the_published_parameter_counts():
    """The presets' shapes give the parameter counts the model cards state
    (unique parameters; tied heads counted once)."""
    counts = {name: param_count(PRESETS[name]) for name in FULL}
    assert counts == {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "llama-3.2-1b": 1_235_814_400,
                      "llama-3.2-3b": 3_212_749_824, "llama-3.1-8b": 8_030_261_248}


def test_unknown_model_is_a_user_error(capsys):
    assert main(["plan", "--models", "gpt-5"]) == 2
    assert "--models: unknown ['gpt-5']" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_models_compiles_shallow_and_extrapolates():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    args = ["--models", "qwen2.5-0.5b", "--targets", "TPU v3-8", "--fit-layers", "1,2", "--seq-len", "64",
            "--grad-accum", "1", "--gen-batch", "8", "--prompt-len", "32", "--new-tokens", "8"]
    out = subprocess.run([sys.executable, "-m", "star_haiku_xmap.plan", "--json", *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [r["program"] for r in rows] == ["train step", "sample (prefill + decode loop)"]
    for r in rows:
        assert r["layers"] == 24 and r["mesh"] == "1x8" and r["fits"] and r["extrapolated_from"] == [1, 2]
    assert rows[0]["master_dtype"] == "float32" and rows[0]["tried"] == 1  # the first settings fit


def test_the_lora_rows_are_the_issue_s_three_models():
    assert LORA == ("llama-3.1-8b+lora", "mistral-7b+lora", "gptj-6b+lora") and set(LORA) <= set(MODELS)
    assert all(name.removesuffix("+lora") in PRESETS for name in LORA)


def test_plan_models_lora_row_compiles_the_adapter_step():
    """A LoRA row: the train step of r = 32 adapters over the frozen bf16 GPT-J-6B (two shallow
    compiles at a short length, extrapolated to 28 layers), on the one-GPU target only."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    args = ["--models", "gptj-6b+lora", "--fit-layers", "1,2", "--seq-len", "32", "--grad-accum", "1",
            "--gen-batch", "1", "--prompt-len", "16", "--new-tokens", "4"]
    out = subprocess.run([sys.executable, "-m", "star_haiku_xmap.plan", "--json", *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [r["program"] for r in rows] == ["LoRA r=32 train step", "sample (prefill + decode loop)"]
    train = rows[0]
    assert train["target"] == "1 GPU (80 GiB)" and train["layers"] == 28 and train["fits"]
    assert train["master_dtype"] == "-" and train["opt_state_dtype"] == "float32"
    # The frozen bf16 base (~11.3 GiB) is an argument; the adapters and their moments add little.
    assert 11.0 * 2**30 < train["argument"] < 12.5 * 2**30
