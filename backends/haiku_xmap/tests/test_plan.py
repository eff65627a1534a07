"""The compiled memory plan (``star-engine plan``) and the GPT-J experiments as CPU
smoke runs: ``experiments/cqa_rationalize.toml`` end to end with the tiny model
swapped in by one ``--set`` (the recipe of README.md / docs/gptj6b.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from star_engine.cli import main

ROOT = Path(__file__).resolve().parents[3]
CQA = ROOT / "plugins" / "cqa" / "tests" / "data" / "train_sample.jsonl"  # has answer keys
GSM8K = ROOT / "plugins" / "gsm8k" / "tests" / "data" / "train_sample.jsonl"
TINY = ["--set", 'model={backend = "haiku_xmap"}']  # the whole [model] table: tiny preset, byte tokenizer


def _plan(*args: str) -> list[dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "star_haiku_xmap.convert.plan", "--json", *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]


def test_plan_compiles_abstract_steps_and_zero_shrinks_the_state():
    """A small GPT-J on 8 simulated devices: the train step (dp 8 with and without
    ZeRO-1) and the sampler compile from abstract parameters; XLA's per-device
    arguments shrink by the partitioned optimizer state."""
    common = ["--preset", "small", "--n-layer", "2", "--batch", "8", "--grad-accum", "2", "--seq-len", "64",
              "--opt-state-dtype", "float32", "--gen-batch", "8", "--prompt-len", "32", "--new-tokens", "8",
              "--dtype", "float32"]
    plain = _plan(*common, "--mesh", "8x1", "--zero", "0", "--what", "train,sample")
    zero = _plan(*common, "--mesh", "8x1", "--zero", "1", "--what", "train")
    assert [r["program"] for r in plain] == ["train step", "sample (prefill + decode loop)"]
    for r in plain + zero:
        assert r["mesh"] == "8x1" and r["peak"] > 0 and r["argument"] > 0 and r["fits"]
    # small preset, 2 layers, fp32: params P bytes per device, Adam moments 2P; ZeRO-1 keeps 2P/8 of them
    p_bytes = (2 * 512 * 256 + 512 + 2 * (4 * 256 * 256 + 2 * 256 * 1024 + 1024 + 3 * 256) + 2 * 256) * 4
    assert abs(plain[0]["argument"] - 3 * p_bytes) < 0.05 * p_bytes
    assert abs(zero[0]["argument"] - (p_bytes + 2 * p_bytes / 8)) < 0.05 * p_bytes


def test_plan_command_is_registered(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--mesh" in out and "--zero" in out and "memory" in out


def test_cqa_rationalize_smoke_run_with_the_tiny_model(tmp_path):
    """The paper's main experiment, unchanged but for four overrides: the tiny
    model, one iteration, a small CQA fixture, a run directory."""
    run = tmp_path / "run"
    rc = main(["run", str(ROOT / "experiments" / "cqa_rationalize.toml"), "--limit", "8", "--quiet", *TINY,
               "--set", "experiment.iterations=1", "--set", f'experiment.output_dir="{run}"',
               "--set", f'task.data={{train = "{CQA}", dev = "{CQA}"}}'])
    assert rc == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"] == {"backend": "haiku_xmap"} and cfg["task"]["dataset"] == "cqa"
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert set(metrics["iteration"]) == {0, 1} and "dev" in set(metrics["split"])
    backend = json.loads((run / "manifest.json").read_text())["backend"]
    assert backend["model"]["n_layer"] == 2 and backend["model"]["d_model"] == 128  # the tiny preset
    assert backend["tokenizer"]["kind"] == "byte" and backend["checkpoint_path"] == ""
    assert (run / "iterations" / "001" / "generated.parquet").is_file()
    assert (run / "report.md").is_file()


@pytest.mark.parametrize("name,data", [("cqa.toml", CQA), ("cqa_direct.toml", CQA), ("gsm8k.toml", GSM8K)])
def test_other_gptj_experiments_validate_with_the_same_override(name, data, capsys):
    split = "test" if name == "gsm8k.toml" else "dev"
    rc = main(["validate", str(ROOT / "experiments" / name), "--limit", "8", *TINY,
               "--set", f'task.data={{train = "{data}", {split} = "{data}"}}'])
    assert rc == 0, capsys.readouterr().err
    assert "backend haiku_xmap" in capsys.readouterr().out


def test_gptj_experiments_name_a_checkpoint_and_a_mesh():
    import tomllib

    for name in ("cqa_rationalize.toml", "cqa.toml", "cqa_direct.toml", "gsm8k.toml"):
        m = tomllib.loads((ROOT / "experiments" / name).read_text())["model"]
        assert m["preset"] == "gptj-6b" and m["checkpoint_path"] and m["mesh"] == {"dp": 1, "mp": 8}, name
        assert m["tokenizer"] == "hf" and "tokenizer_file" not in m and m["dtype"] == "bfloat16", name


@pytest.mark.slow
def test_the_shipped_gptj_experiments_fit_a_tpu_v3_core():
    """GPT-J-6B as the experiments declare it (mesh, dtype, master / moment / accumulator
    dtypes, remat, micro-batch, accumulation, sequence length): XLA's per-device peak for the train step
    and the sampler is within a TPU v3 core's 16 GiB."""
    import tomllib

    cfg = tomllib.loads((ROOT / "experiments" / "cqa_rationalize.toml").read_text())
    m, t, g = cfg["model"], cfg["training"], cfg["generation"]
    mesh = f'{m["mesh"]["dp"]}x{m["mesh"]["mp"]}'
    rows = _plan("--preset", m["preset"], "--dtype", m["dtype"], "--mesh", mesh, "--zero", str(m["zero"]),
                 "--opt-state-dtype", m["opt_state_dtype"], "--master-dtype", m.get("master_dtype", "float32"),
                 "--grad-accum-dtype", m.get("grad_accum_dtype", "float32"), *(["--remat"] if m.get("remat") else []),
                 "--batch", str(t["batch_size"]),
                 "--grad-accum", str(t["grad_accum"]), "--seq-len", str(m["seq_len"]),
                 "--gen-batch", str(g["batch_size"]), "--prompt-len", str(m["seq_len"]),
                 "--new-tokens", str(g["max_new_tokens"]), "--device-gib", "16", "--what", "train,sample")
    assert [r["program"] for r in rows] == ["train step", "sample (prefill + decode loop)"]
    for r in rows:
        assert r["layers"] == 28 and r["fits"], r
