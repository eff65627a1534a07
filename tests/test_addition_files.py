"""The embedded default's three files say the same experiment where they claim to:
``addition.toml`` (STaR from the committed base), ``addition_from_scratch.toml`` (the same run
with the base training that made that base) and ``addition_no_rationalization.toml`` (its
ablation). A setting changed in one and not the others would make their comparison (README,
docs/addition.md) a comparison of something else."""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "experiments"


def _load(name: str) -> dict:
    return tomllib.loads((EXP / name).read_text())


def _without(data: dict, *keys: str) -> dict:
    out = copy.deepcopy(data)
    for key in keys:
        section, _, name = key.partition(".")
        if name:
            out.get(section, {}).pop(name, None)
        else:
            out.pop(section, None)
    return out


NAMING = ("experiment.name", "experiment.output_dir", "experiment.expected_minutes", "experiment.expected_gflops")


def test_from_scratch_is_the_default_with_the_base_training_that_made_its_base():
    default, scratch = _load("addition.toml"), _load("addition_from_scratch.toml")
    assert default["model"]["checkpoint_path"] and "base_training" not in default
    assert "checkpoint_path" not in scratch["model"] and scratch["base_training"]["steps"] > 0
    assert (_without(default, *NAMING, "model.checkpoint_path", "model.checkpoint_sha256", "model.preset")
            == _without(scratch, *NAMING, "base_training", "model.preset"))


def test_the_twin_differs_only_in_rationalization():
    default, twin = _load("addition.toml"), _load("addition_no_rationalization.toml")
    assert twin["rationalization"] == {"enabled": False} and "hint" not in twin["task"]
    assert (_without(default, *NAMING, "rationalization", "task.hint")
            == _without(twin, *NAMING, "rationalization", "task.hint"))


def test_the_committed_base_is_the_pinned_one_and_validates(tmp_path):
    default = _load("addition.toml")
    base = (EXP / default["model"]["checkpoint_path"]).resolve()
    assert hashlib.sha256((base / "manifest.msgpack").read_bytes()).hexdigest() == default["model"]["checkpoint_sha256"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    for name in ("addition.toml", "addition_no_rationalization.toml"):
        res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(EXP / name)], capture_output=True,
                             text=True, env=env, cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr
