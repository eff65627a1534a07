"""What the tests of every folder share: the toy experiment, running the CLI in a subprocess
with the scripted backend (``star_testkit.scripted``), where the real data lives; the fuzz
tests' pieces are in ``star_testkit.fuzzing``. A uniquely named package on the tests' path
(pyproject.toml's ``pythonpath``), so that no generic module name (``helpers``) is importable."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
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
    env.update({"STAR_ENGINE_DISABLE_AUTOLOAD": "1", "STAR_ENGINE_PLUGINS": "star_testkit.scripted",
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
    from star_testkit.scripted import ToyTask

    return ToyTask().load(split, None)


def load_script(path: Path) -> types.ModuleType:
    """Import a script that is not part of a package (benchmarks/*.py) as ``_script_<stem>``,
    its own folder on ``sys.path`` only while it is imported (for its imports of the scripts
    beside it, which must carry unique names: ``bench_common``), so that no generic name
    (``ceiling``) stays importable."""
    name = f"_script_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it is executed
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(path.parent))
    return module


class Killed(Exception):
    """What ``killer``'s callback raises: a stage stopped mid-way, as a kill would."""


def killer(after: int, calls: list):
    """A progress callback that records its calls in ``calls`` and raises ``Killed`` once
    ``after`` steps are done (a training stage interrupted, for the resume tests)."""
    def progress(n: int) -> None:
        calls.append(n)
        if sum(calls) >= after:
            raise Killed

    return progress
