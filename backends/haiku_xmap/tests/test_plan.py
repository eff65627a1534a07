"""The compiled memory plan (``star-engine plan``), of a model and mesh given by options or of what
an experiment file will run (``plan EXPERIMENT.toml``), and the GPT-J experiments validating with
the tiny model swapped in by one ``--set``. (The README's smoke run of
``experiments/cqa_rationalize.toml`` is ``tests/test_readme_smoke.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from star_engine.cli import main


ROOT = Path(__file__).resolve().parents[3]
CQA = ROOT / "plugins" / "cqa" / "tests" / "data" / "train_sample.jsonl"  # has answer keys
GSM8K = ROOT / "plugins" / "gsm8k" / "tests" / "data" / "train_sample.jsonl"
TINY = ["--set", 'model={backend = "haiku_xmap"}']  # the whole [model] table: tiny preset, byte tokenizer


def _plan(*args: str) -> list[dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-m", "star_haiku_xmap.plan", "--json", *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
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


def test_plan_an_experiment_plans_what_it_will_run(tmp_path, star):
    """``star-engine plan experiments/addition.toml``: its 6-layer model (the committed checkpoint), its
    [training] step (8 x 1 x 512) and its [generation] batch (100 rows of the longest prompt the backend keeps,
    512 - 230, and 230 new tokens), compiled; ``--set`` changes the experiment as run --set does."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    addition = str(ROOT / "experiments" / "addition.toml")
    out = subprocess.run([sys.executable, "-m", "star_engine", "plan", addition, "--json",
                          "--set", "training.batch_size=4"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [r["program"] for r in rows] == ["train step", "sample (prefill + decode loop)"]
    assert [r["shape"] for r in rows] == ["1 x 4 x 512", "100 x (282 + 230)"]
    assert all(r["layers"] == 6 and r["mesh"] == "1x1" and r["dtype"] == "float32" and r["fits"] for r in rows)
    text = subprocess.run([sys.executable, "-m", "star_engine", "plan", addition, "--what", "sample"], env=env,
                          capture_output=True, text=True, timeout=300)
    base = (ROOT / "experiments" / "bases" / "addition").resolve()  # the committed base the file starts from
    assert text.returncode == 0 and text.stdout.startswith(f"# {addition}: the checkpoint {base}, 6 layers"), text.stdout
    for args, says in ((["--mesh", "1x8"], "--mesh: not with an experiment file"),
                       (["--set", "training.batch_size=0"], "training.batch_size: must be >= 1")):
        code, err = star("plan", addition, *args)
        assert code == 2 and says in err and err.count("\n") == 1, err
    code, err = star("plan", "--set", "a=1")
    assert code == 2 and "--set: only with an experiment file" in err


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
def test_plan_an_experiment_plans_its_base_and_verifier_steps(star):
    """``--what base,verifier``: the [base_training] step at its own shape and the verifier's DPO
    step (B pairs: 2B rows with their reference log-probabilities), which needs more than the [training] step of B rows; the default plan names the steps it leaves
    out; a step the experiment does not run is refused, naming how to plan it."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    exp = str(ROOT / "experiments" / "addition_verifier.toml")
    small = ["--set", "model.seq_len=64", "--set", "training.batch_size=2", "--set", "base_training.batch_size=3",
             "--set", "verifier.batch_size=2"]
    out = subprocess.run([sys.executable, "-m", "star_engine", "plan", exp, "--json", *small,
                          "--what", "train,base,verifier"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    train, base, dpo = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert [r["program"] for r in (train, base, dpo)] == ["train step", "[base_training] train step",
                                                          "[verifier] DPO step"]
    assert [r["shape"] for r in (train, base, dpo)] == ["1 x 2 x 64", "1 x 3 x 64", "1 x 4 x 64"]
    assert dpo["temp"] > train["temp"]
    text = subprocess.run([sys.executable, "-m", "star_engine", "plan", exp, *small, "--what", "sample"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr[-3000:]
    for w in ("train", "base", "verifier"):
        assert f"plan it with --what {w}" in text.stdout
    for name, args, says in (
            ("addition.toml", ["--what", "verifier"], "--set verifier.enabled=true"),
            ("gsm8k_qwen.toml", ["--what", "base"], "--set base_training.steps="),
            ("addition_verifier.toml", [*small, "--what", "train,critic"],
             "--what: a comma-separated list of train, base, verifier")):
        code, err = star("plan", str(ROOT / "experiments" / name), *args)
        assert code == 2 and says in err and err.count("\n") == 1, err
    code, err = star("plan", "--what", "verifier")
    assert code == 2 and "an experiment's steps" in err


@pytest.mark.parametrize("name,layers,mesh,batch,seq_len,opt,adapter", [
    ("cqa.toml", 28, (1, 8), (1, 64), 1536, "bfloat16", None),  # GPT-J-6B: its preset, the checkpoint not converted
    ("cqa_llama.toml", 28, (1, 1), (1, 64), 1536, "float32", None),
    ("gsm8k_qwen.toml", 28, None, None, None, None, None),
])
def test_plan_reads_the_experiments_settings(name, layers, mesh, batch, seq_len, opt, adapter):
    """What ``plan EXPERIMENT`` compiles, read from the file without compiling: the model (the
    checkpoint's config when it is converted, else the preset's), mesh, dtypes, batch x
    grad_accum x seq_len, and the sampler's rows, longest prompt and new tokens."""
    import argparse
    import tomllib

    from star_haiku_xmap.plan.experiment import DECIDED, job

    args = argparse.Namespace(experiment=ROOT / "experiments" / name, overrides=[],
                              **{attr: None for _, attr in DECIDED})
    cfg = tomllib.loads((ROOT / "experiments" / name).read_text())
    config, kw, line = job(args)
    m, t, g = cfg["model"], cfg["training"], cfg["generation"]
    assert config.n_layer == layers and config.dtype == m["dtype"] and m["preset"] in line
    assert (kw["dp"], kw["mp"]) == (m["mesh"]["dp"], m["mesh"]["mp"]) and kw["zero"] == m.get("zero", 0)
    assert (kw["batch"], kw["grad_accum"], kw["seq_len"]) == (t["batch_size"], t["grad_accum"], m["seq_len"])
    assert (kw["gen_batch"], kw["new_tokens"]) == (g["batch_size"], g["max_new_tokens"])
    assert kw["prompt_len"] == config.n_ctx - g["max_new_tokens"]
    assert kw["opt_state_dtype"] == m.get("opt_state_dtype", "float32")
    assert kw["master_dtype"] == m.get("master_dtype", "float32") and kw["accum_dtype"] == m.get("grad_accum_dtype",
                                                                                               "float32")
    if mesh is not None:
        assert (kw["dp"], kw["mp"]) == mesh and (kw["batch"], kw["grad_accum"]) == batch and kw["seq_len"] == seq_len
        assert kw["opt_state_dtype"] == opt and kw["adapter"] is adapter


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
