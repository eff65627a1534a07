"""What the GPT-J backend would refuse during a run is refused before it (``validate_run``,
``preflight.py``): ``star-engine validate`` reports it and ``star-engine run`` writes nothing.
Also: backend option errors name their ``[model]`` key, and ``star-engine plan`` refuses bad
arguments in one line."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

from star_engine.api import GenSpec, TrainSpec
from star_engine.config.load import check_table
from star_engine.errors import IntegrityError, UserError
from star_haiku_xmap import preflight
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.model.network import init_params
from star_haiku_xmap.options import AdamW
from star_haiku_xmap.plugin import HaikuXmapBackend

EXPERIMENT = """
[experiment]
name = "preflight"
iterations = 1
output_dir = "{out}"
[task]
dataset = "addition"
options = {{ n_train = 8, n_dev = 4, max_digits = 2, n_seed = 4 }}
[model]
backend = "haiku_xmap"
"""


@pytest.mark.parametrize("sets,expected", [
    (["generation.max_new_tokens=600"], "generation.max_new_tokens: 600 leaves no room for a prompt in the model's "
                                        "context of n_ctx = 512 tokens"),
    (["evaluation.max_new_tokens=512"], "evaluation.max_new_tokens: 512 leaves no room"),
    (["base_training.steps=2", "base_training.optimizer.b1=1.0"], "base_training.optimizer.b1: must be in [0, 1), got 1.0"),
    (["model.n_layer=0"], "model.n_layer: must be >= 1, got 0"),
    (["model.n_ctx=8"], "generation.max_new_tokens: 96 leaves no room for a prompt in the model's context of "
                        "n_ctx = 8"),
], ids=["generation", "evaluation", "optimizer", "model_option", "small_context"])
def test_validate_and_run_refuse_before_writing(tmp_path, star, sets, expected):
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix()))
    args = [a for s in sets for a in ("--set", s)]
    for command in ("validate", "run"):
        code, err = star(command, str(toml), *args)
        assert code == 2, (command, err[-3000:])
        # the faulty value's origin first: the --set that gave it, or the file (n_ctx=8 makes the file's 96 too many)
        origin = f"{toml}: " if "n_ctx=8" in sets[0] else f"--set {sets[-1]}: "
        assert err.startswith("error: " + origin) and err.count("\n") == 1, err
        assert expected in err and "model: model:" not in err, err
    assert not (tmp_path / "run").exists()  # run used to create it (base checkpoint, events, config) first


@pytest.mark.parametrize("sets,expected", [
    (["model.vocab=100000000000"], "model: the model of 25,700,000,395,264 parameters (n_layer 2, d_model 128, "
                                   "vocab 100000000000) has a weight of 51,200,000,000,000 bytes, more than the limit"),
    (["model.n_layer=100", "model.d_model=16384", "model.n_head=128", "model.d_head=128", "model.d_ff=65536"],
     "GiB of memory this process can allocate; choose a smaller model"),
    (["model.n_layer=1000000"], "model.n_layer: at most 1024, got 1000000"),
    (["model.n_ctx=100000000000"], "model.n_ctx: at most 1048576, got 100000000000"),
    (["model.cpu_devices=100000"], "model.cpu_devices: at most 1024, got 100000"),
], ids=["vocab", "memory", "layers", "context", "cpu_devices"])
def test_a_model_the_machine_cannot_hold_is_refused_before_anything_is_allocated(tmp_path, star, sets, expected):
    """Sizes that would hang jax (a 10^6-layer trace), crash XLA:CPU (10^5 devices) or exhaust
    the memory (a 10^11-token vocabulary) are one line naming [model], from validate and from run
    before it writes anything; counted from abstract shapes without starting jax's backends."""
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix()))
    args = [a for s in sets for a in ("--set", s)]
    for command in ("validate", "run"):
        code, err = star(command, str(toml), *args)
        assert code == 2 and err.count("\n") == 1 and expected in err, (command, err[-3000:])
    assert not (tmp_path / "run").exists()


def _checkpoint(path: Path) -> Path:
    cfg = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=32, rotary_dim=4, n_ctx=64, vocab=264)
    CW.save_checkpoint(path, jax.tree.map(np.asarray, init_params(cfg, 0)), model_config=cfg.to_dict(),
                      tokenizer={"kind": "byte", "vocab_size": 257, "eos_id": 256})
    return path


def test_a_damaged_checkpoint_path_is_refused_by_validate(tmp_path, star):
    ck = _checkpoint(tmp_path / "ck")
    part = sorted(ck.glob("*.zst"))[3]
    part.write_bytes(part.read_bytes()[:-3])
    toml = tmp_path / "exp.toml"
    toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix()) + 'checkpoint_path = "ck"\n'
                    "[generation]\nmax_new_tokens = 16\n")
    code, err = star("validate", str(toml))
    assert code == 2 and err.count("\n") == 1, err
    assert f"{part}: " in err and "truncated or replaced" in err
    part.unlink()
    code, err = star("run", str(toml))
    assert code == 2 and f"{part}: part file missing" in err, err
    assert not (tmp_path / "run").exists()


def test_validate_run_checks_each_spec(tmp_path):
    backend = HaikuXmapBackend.from_table(preset="tiny")
    ok = GenSpec(16, 0.0, 1.0, (), 4)
    train = TrainSpec(0, 4, 1, 0, {"lr": 1e-3, "warmup_steps": 0})
    backend.validate_run({"generation": ok, "evaluation": ok}, {"training": train})
    # What depends on the model only: the sampling values and sizes are the core's to check
    # (star_engine.config.settings declares their ranges; GenSpec documents them), once.
    with pytest.raises(UserError, match="generation.max_new_tokens: 512 leaves no room") as e:
        backend.validate_run({"generation": GenSpec(512, 0.0, 1.0, (), 4)}, {})
    assert e.value.key == "generation.max_new_tokens"
    backend.validate_run({"generation": GenSpec(511, 0.0, 1.0, (), 4)}, {})  # one token of prompt: as generate
    # The optimizer tables are checked once, by the backend's table, when the experiment is
    # loaded (config.load_experiment -> Backend.optimizer_table), not again here.
    assert HaikuXmapBackend.optimizer_table is AdamW
    for opt, message in [({"lr": -1.0}, "training.optimizer.lr: must be > 0"),
                         ({"schedule": "exp"}, "training.optimizer.schedule: must be one of"),
                         ({"lrr": 1.0}, "unknown key 'training.optimizer.lrr' (did you mean 'lr'?)")]:
        with pytest.raises(UserError, match=re.escape(message)):
            check_table(opt, AdamW.schema(), "training.optimizer")
    ck = _checkpoint(tmp_path / "ck")
    assert preflight.check_checkpoint(ck)["version"] == C.VERSION
    (ck / C.MANIFEST).write_bytes(b"\x80")
    with pytest.raises(IntegrityError, match="manifest.msgpack"):
        preflight.check_checkpoint(ck)


@pytest.mark.parametrize("args,expected", [
    (["--mesh", "0x8"], "--mesh: dp and mp must be >= 1"),
    (["--mesh", "100x100"], "at most 4096"),
    (["--n-layer", "0"], "--n-layer: must be >= 1, got 0"),
    (["--preset", "gptj-7b"], "--preset: unknown preset 'gptj-7b'"),
    (["--what", "everything"], "--what: a comma-separated list of train, sample"),
    (["--seq-len", "4096"], "--seq-len: 4096 is more than the model's context n_ctx = 2048"),
    (["--device-gib", "nan"], "--device-gib: must be a positive number"),
    (["--batch", "0"], "--batch: must be >= 1"),
], ids=["zero_mesh", "huge_mesh", "no_layers", "preset", "what", "seq_len", "device_gib", "batch"])
def test_plan_refuses_bad_arguments_in_one_line(star, args, expected):
    code, err = star("plan", *args)  # refused before any device is set up or anything compiled
    assert code == 2, err[-3000:]
    assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, err
