"""Helpers shared by the core tests: the toy experiment and running the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# The real data sets and the original STaR prompt files (never in the repository):
# ../shared/data next to the checkout, or wherever STAR_SHARED_DATA points (a git
# worktree elsewhere). Tests that need them are marked real_data and skip without them.
SHARED_DATA = Path(os.environ.get("STAR_SHARED_DATA") or REPO.parent / "shared" / "data")
STAR_PROMPTS = SHARED_DATA / "star-prompts"

TOY_TOML = """
[experiment]
name = "toy"
seed = 7
output_dir = "{out}"
iterations = 3

[task]
dataset = "toy"
filters = ["toy_leak"]

[generation]
max_new_tokens = 32
batch_size = 4
chunk_size = 5

[rationalization]
enabled = true
p_rationalization = 1.0

[training]
schedule = {{ name = "toy_linear", per_iteration = 3 }}
restart_from_base = true

[evaluation]
splits = ["dev"]

[model]
backend = "scripted"
"""


def scripted_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"STAR_ENGINE_DISABLE_AUTOLOAD": "1", "STAR_ENGINE_PLUGINS": "scripted_plugin",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH", "")]))})
    env.pop("SCRIPTED_KILL", None)
    env.pop("SCRIPTED_SLEEP", None)
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "star_engine", *args], capture_output=True, text=True,
                          env=env or scripted_env(), cwd=cwd, timeout=300)




def scripted_plugin_examples(split: str = "train"):
    """The toy task's questions of ``split`` as a run of TOY_TOML loads them."""
    from scripted_plugin import ToyTask

    return ToyTask().load(split, None)
