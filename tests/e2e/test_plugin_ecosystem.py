"""The plugin ecosystem end to end.

1. A third-party package (examples/star-plugin-example) installed into a *fresh*
   virtual environment is found through its entry points, runs an experiment with
   the tiny GPT-J model, and is gone again after ``pip uninstall``.
2. Every hook of ``star_engine.hooks`` is exercised by an in-test plugin: the six
   ``register_*`` hooks provide every component of a run, and the four observer
   hooks are called in order with what the run wrote.

How the fresh environment gets its dependencies, offline: ``python -m venv
--without-pip`` (no system site-packages), then a ``.pth`` file in its
site-packages naming a folder of symlinks to everything in *this* environment's
site-packages except star-engine's own distributions, editable-install hooks and
``.pth`` files (which a plain ``.pth`` path would not run anyway). So jax, pyarrow,
pip and setuptools come from here without a download, while star-engine, its
plugins and the example exist in the new environment only as far as the test
installs them: copies of their folders, ``pip install --no-deps
--no-build-isolation --no-index`` (copies, because building writes ``build/`` and
``*.egg-info`` next to the sources). Nothing is fetched from a package index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import REPO, TESTS, TOY_TOML
from star_engine import hookimpl
from star_engine.cli import main

EXAMPLE = REPO / "examples" / "star-plugin-example"
EXAMPLE_TOML = "experiments/units_tiny.toml"
# What the example experiment needs: the core, the backend, the schedules, the filters, the example.
SOURCES = [REPO, REPO / "plugins/filters", REPO / "plugins/schedules", REPO / "backends/haiku_xmap", EXAMPLE]
EXAMPLE_COMPONENTS = {"task": ["unit_conversion"], "checker": ["unit_numeric"], "hint": ["unit_answer"]}


# ----------------------------------------------------------------------------- a fresh environment


def _own(name: str) -> bool:
    """Entries of site-packages that must not leak into the fresh environment."""
    return name.startswith(("star_", "star-", "__editable__")) or name.endswith((".pth", ".egg-link"))


def _copy_project(src: Path, dst: Path) -> Path:
    """The files a build needs: pyproject, README and the listed packages (all of the example)."""
    meta = tomllib.loads((src / "pyproject.toml").read_text())
    if src == EXAMPLE:
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__", "runs"))
        return dst
    dst.mkdir(parents=True)
    shutil.copy2(src / "pyproject.toml", dst)
    if (src / "README.md").exists():
        shutil.copy2(src / "README.md", dst)
    for pkg in meta["tool"]["setuptools"]["packages"]:
        if "." not in pkg:  # a subpackage comes with its package's folder
            shutil.copytree(src / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


class Venv:
    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.python = self.bin / "python"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("STAR_ENGINE_", "PIP_", "PYTHON")) and k not in ("VIRTUAL_ENV", "SCRIPTED_KILL")}
        self.env.update(VIRTUAL_ENV=str(root), PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                        PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")

    def __call__(self, *args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, env=self.env, cwd=cwd, timeout=timeout)

    def star(self, *args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
        return self(str(self.bin / "star-engine"), *args, cwd=cwd, timeout=timeout)

    def pip(self, *args: str, cwd: Path) -> subprocess.CompletedProcess:
        return self(str(self.python), "-m", "pip", *args, cwd=cwd)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> tuple[Venv, Path]:
    tmp = tmp_path_factory.mktemp("ecosystem")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "venv")], check=True, timeout=120)
    venv = Venv(tmp / "venv")
    deps = tmp / "deps"
    deps.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in here.iterdir():
        if not _own(entry.name):
            (deps / entry.name).symlink_to(entry)
    site = Path(venv("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp).stdout.strip())
    assert site.is_relative_to(venv.root), site
    (site / "_current_env_deps.pth").write_text(f"{deps}\n")
    res = venv("python", "-c", "import jax, pyarrow, pip, setuptools; import star_engine", cwd=tmp)
    assert res.returncode == 1 and "No module named 'star_engine'" in res.stderr, res.stderr  # isolated
    copies = [_copy_project(src, tmp / "src" / (src.name if src != REPO else "star-engine")) for src in SOURCES]
    res = venv.pip("install", "--no-deps", "--no-build-isolation", "--no-index", *map(str, copies), cwd=tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    return venv, tmp


def test_third_party_plugin_lifecycle(fresh):
    venv, tmp = fresh
    toml = tmp / "src" / EXAMPLE.name / EXAMPLE_TOML

    # 1. Discovered through its entry point, with its distribution and version.
    res = venv.star("plugins", "--json", cwd=tmp)
    assert res.returncode == 0, res.stderr
    plugins = {p["name"]: p for p in json.loads(res.stdout)}
    assert set(plugins) == {"example", "filters", "schedules", "haiku_xmap"}  # nothing from the outer env
    assert all(p["error"] is None for p in plugins.values()), plugins
    ex = plugins["example"]
    assert (ex["distribution"], ex["version"], ex["components"]) == ("star-plugin-example", "0.1.0",
                                                                     EXAMPLE_COMPONENTS)
    assert ex["hooks"] == ["register_checkers", "register_hint_formatters", "register_tasks"]
    res = venv.star("plugins", "--requirements", cwd=tmp)
    assert res.returncode == 0, res.stderr
    requirements = res.stdout.splitlines()
    assert requirements == sorted(requirements) and all(re.fullmatch(r"[A-Za-z0-9._-]+==[\w.+!-]+", r)
                                                        for r in requirements), requirements
    assert {"star-plugin-example==0.1.0", "star-engine==0.1.0", "star-engine-haiku-xmap==0.1.0"} <= set(requirements)

    # 2. The package's own tests pass against the installed package.
    where = venv("python", "-c", "import star_plugin_example as m; print(m.__file__, m.__version__)", cwd=tmp)
    assert where.stdout.split() == [str(next(venv.root.glob("lib/python*/site-packages"))
                                        / "star_plugin_example/__init__.py"), "0.1.0"], where.stdout
    res = venv("python", "-m", "pytest", "-q", str(toml.parents[1] / "tests"), cwd=tmp, timeout=300)
    assert res.returncode == 0 and " passed" in res.stdout, res.stdout[-3000:]

    # 3. Its experiment runs with the tiny GPT-J (fewer base steps than the file's: a smoke run).
    run_dir = tmp / "run"
    res = venv.star("run", str(toml), "--limit", "4", "--quiet", "--set", f'experiment.output_dir="{run_dir}"',
                    "--set", "base_training.steps=20", cwd=tmp, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    assert {(r["iteration"], r["split"]) for r in metrics if r["class"] == "all"} >= {(0, "dev"), (1, "dev"), (2, "dev")}
    assert all(r["n"] == 4 for r in metrics if r["split"] == "dev" and r["class"] == "all")
    rationales = pq.read_table(run_dir / "iterations/001/rationales.parquet").to_pylist()
    assert rationales and {r["checker"] for r in rationales} == {"unit_numeric"}
    assert all(r["prompt"].startswith("Q: How many ") for r in rationales)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"]["dataset"] == "unit_conversion" and config["model"]["preset"] == "tiny"
    # The run directory records the same requirement lines as `star-engine plugins --requirements`.
    assert (run_dir / "requirements.txt").read_text().splitlines() == requirements
    assert json.loads((run_dir / "manifest.json").read_text())["requirements"] == requirements

    # 4. Uninstalled: no longer listed, and the experiment names an unknown task.
    res = venv.pip("uninstall", "-y", "star-plugin-example", cwd=tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    res = venv.star("plugins", "--json", cwd=tmp)
    assert res.returncode == 0, res.stderr
    after = json.loads(res.stdout)
    assert "example" not in {p["name"] for p in after}
    assert not any("unit_conversion" in names for p in after for names in p["components"].values())
    assert "star-plugin-example==0.1.0" not in venv.star("plugins", "--requirements", cwd=tmp).stdout
    res = venv.star("validate", str(toml), cwd=tmp)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "unknown task 'unit_conversion'" in res.stderr and "task.dataset" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


# ----------------------------------------------------------------------------- every hook, exercised


def probe_plugin(calls: list[tuple]) -> types.ModuleType:
    """A plugin implementing all ten hooks: it renames the scripted plugin's components and
    records the observer calls."""
    import star_testkit.scripted as sp

    mod = types.ModuleType("hook_probe")

    def register_tasks(register):
        register("probe_task", sp.ToyTask)

    def register_checkers(register):
        register("probe_exact", sp.ToyExact)

    def register_hint_formatters(register):
        register("probe_hint", sp.ToyHint)

    def register_filters(register):
        register("probe_leak", sp.ToyLeakFilter)

    def register_schedules(register):
        register("probe_linear", sp.ToyLinear)

    def register_backends(register):
        register("probe_backend", sp.ScriptedBackend)

    def on_run_start(run_dir, config):
        calls.append(("on_run_start", run_dir, config))

    def on_iteration_start(run_dir, iteration):
        calls.append(("on_iteration_start", run_dir, iteration))

    def on_iteration_end(run_dir, iteration, metrics, losses):
        calls.append(("on_iteration_end", run_dir, iteration, list(metrics), list(losses)))

    def on_run_end(run_dir, metrics):
        calls.append(("on_run_end", run_dir, list(metrics)))

    for fn in (register_tasks, register_checkers, register_hint_formatters, register_filters, register_schedules,
               register_backends, on_run_start, on_iteration_start, on_iteration_end, on_run_end):
        setattr(mod, fn.__name__, hookimpl(fn))
    return mod


PROBE_TOML = (TOY_TOML.replace('dataset = "toy"', 'dataset = "probe_task"\nchecker = "probe_exact"\nhint = "probe_hint"')
              .replace('["toy_leak"]', '["probe_leak"]').replace('"toy_linear"', '"probe_linear"')
              .replace('"scripted"', '"probe_backend"'))


def test_every_hook_is_called(monkeypatch, tmp_path):
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "hook_probe", probe_plugin(calls))
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "hook_probe")  # only the probe: every component must come from it
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)
    path = tmp_path / "probe.toml"
    path.write_text(PROBE_TOML.format(out=(tmp_path / "run").as_posix()))
    assert main(["run", str(path), "--quiet"]) == 0
    run = tmp_path / "run"

    # register_*: the run used each registered component.
    manifest = json.loads((run / "manifest.json").read_text())
    (probe,) = manifest["plugins"]
    assert probe["name"] == "hook_probe" and probe["components"] == {
        "task": ["probe_task"], "checker": ["probe_exact"], "hint": ["probe_hint"], "filter": ["probe_leak"],
        "schedule": ["probe_linear"], "backend": ["probe_backend"]}
    assert manifest["backend"]["backend"] == "scripted"
    r1 = pq.read_table(run / "iterations/001/rationales.parquet").to_pylist()
    assert {r["checker"] for r in r1} == {"probe_exact"}
    assert any(r["rejected_by"] == "probe_leak" for r in r1) and any(r["was_hinted"] for r in r1)
    assert [json.loads((run / f"iterations/{n:03d}/train.json").read_text())["steps"] for n in (1, 2, 3)] == [3, 6, 9]

    # Observers: order, arguments, and the data they see equal what the run wrote.
    names = [(c[0], c[2] if c[0].startswith("on_iteration") else None) for c in calls]
    assert names == [("on_run_start", None),
                     *[(h, n) for n in range(4) for h in ("on_iteration_start", "on_iteration_end")],
                     ("on_run_end", None)]
    assert all(c[1] == run for c in calls)
    assert calls[0][2] == json.loads((run / "config.json").read_text())
    for call in calls:
        if call[0] == "on_iteration_end":
            n, metrics, losses = call[2], call[3], call[4]
            assert metrics == pq.read_table(run / f"iterations/{n:03d}/metrics.parquet").to_pylist()
            want = json.loads((run / f"iterations/{n:03d}/train.json").read_text())["losses"] if n else []
            assert losses == want and (n == 0 or len(losses) == 3 * n)
    assert calls[-1][2] == pq.read_table(run / "metrics.parquet").to_pylist()

    # Rerunning the finished run does no work, but observers see every iteration again.
    calls.clear()
    assert main(["run", str(path), "--quiet"]) == 0
    assert [c[0] for c in calls].count("on_iteration_start") == 4 and calls[0][0] == "on_run_start"
    assert [c[0] for c in calls].count("on_iteration_end") == 4 and calls[-1][0] == "on_run_end"
    assert calls[-1][2] == pq.read_table(run / "metrics.parquet").to_pylist()
