"""Broken third-party plugins, through the command line: small plugin packages written into a
temporary folder on PYTHONPATH (a module, and a ``.dist-info`` giving it a distribution,
a version and an entry point), loaded by entry point or by STAR_ENGINE_PLUGINS, next to the
scripted backend of tests/star_testkit/scripted.py.

A plugin that fails to import, has a hook with a wrong signature or a misspelled hook is
reported with its distribution, version and the hook, and is fatal only to an experiment that
uses it. A checker, filter or observer that raises in iteration 3 stops the run with one line
naming it; once the plugin is fixed, the same command resumes at iteration 3 (iterations 1 and
2 untouched) and ends with what an uninterrupted run gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import TESTS, TOY_TOML


def install(site: Path, dist: str, version: str, package: str, source: str, entry_point: str | None) -> None:
    """A package ``package`` (its ``plugin`` module is ``source``) of distribution ``dist``."""
    for old in site.glob(f"{dist.replace('-', '_')}-*.dist-info"):
        shutil.rmtree(old)
    (site / package).mkdir(parents=True, exist_ok=True)
    (site / package / "__init__.py").write_text("")
    (site / package / "plugin.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(package + "\n")
    if entry_point:
        (info / "entry_points.txt").write_text(f"[star_engine]\n{entry_point} = {package}.plugin\n")


def env_for(site: Path, modules: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    env.update({"STAR_ENGINE_PLUGINS": ",".join(filter(None, ["star_testkit.scripted", modules])),
                "STAR_ENGINE_BLOCK_PLUGINS": "tracking", "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), str(site), env.get("PYTHONPATH", "")]))})
    return env


def star(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "star_engine", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def one_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ plugins that do not load

IMPORT_FAILS = """
    import star_engine_gpu_kernels  # not installed
    from star_engine import hookimpl

    @hookimpl
    def register_checkers(register):
        register("gpu_exact", object)
"""
WRONG_SIGNATURE = """
    from star_engine import hookimpl

    class Exact:
        def check(self, generation, extracted, gold):
            raise AssertionError("never registered")

    @hookimpl
    def register_checkers(register, priority):
        register("fussy_exact", Exact)
"""
MISSPELLED = """
    from star_engine import hookimpl

    class Exact:
        def check(self, generation, extracted, gold):
            raise AssertionError("never registered")

    @hookimpl
    def register_checker(register):
        register("typo_exact", Exact)
"""
BROKEN = [  # (dist, version, package, source, checker it would provide, what the report must say)
    ("star-gpu-checkers", "0.3.0", "star_gpu_checkers", IMPORT_FAILS, "gpu_exact",
     ["failed to import", "ModuleNotFoundError: No module named 'star_engine_gpu_kernels'"]),
    ("star-fussy", "2.0.1", "star_fussy", WRONG_SIGNATURE, "fussy_exact",
     ["register_checkers", "priority"]),
    ("star-typo", "1.1.0", "star_typo", MISSPELLED, "typo_exact",
     ["hook 'register_checker' is not a star_engine hook (did you mean 'register_checkers'"]),
]


@pytest.fixture
def broken_site(tmp_path):
    site = tmp_path / "site"
    for dist, version, package, source, _, _ in BROKEN:
        install(site, dist, version, package, source, entry_point=package)
    return site


def test_broken_plugins_listed_with_distribution_version_and_hook(broken_site, tmp_path):
    """Listed in full (every form), then the exit code says a plugin failed to load: 2, with one
    line naming them on stderr."""
    res = star("plugins", "--json", env=env_for(broken_site), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert one_line(res.stderr).startswith(f"error: {len(BROKEN)} installed plugin(s) failed to load: ")
    plugins = {p["name"]: p for p in json.loads(res.stdout)}
    for dist, version, package, _, _, says in BROKEN:
        p = plugins[package]
        assert (p["distribution"], p["version"]) == (dist, version)
        assert all(s in p["error"] for s in says), p["error"]
        assert "\n" not in p["error"]
        assert p["components"] == {}  # nothing half-registered
    assert plugins["star_testkit.scripted"]["error"] is None and plugins["cqa"]["error"] is None
    res = star("plugins", env=env_for(broken_site), cwd=tmp_path)  # the table shows them too
    assert res.returncode == 2 and "star-fussy" in res.stdout and "2.0.1" in res.stdout
    res = star("plugins", "--requirements", env=env_for(broken_site), cwd=tmp_path)
    assert res.returncode == 2 and "star-fussy==2.0.1" in res.stdout.splitlines()
    (tmp_path / "empty-site").mkdir()  # the same installation without the broken ones: 0
    res = star("plugins", env=env_for(tmp_path / "empty-site"), cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "", res.stderr


def _squeezed(text: str) -> str:
    """``text`` without whitespace and table borders: what is left of a cell's words, in order."""
    return "".join(c for c in text if not c.isspace() and not 0x2500 <= ord(c) <= 0x257F)


def _in_order(needle: str, haystack: str) -> bool:
    it = iter(haystack)
    return all(c in it for c in needle)


def test_plugins_listing_in_a_pipe_and_a_narrow_terminal_keeps_every_error_whole(broken_site, tmp_path):
    """In a pipe (not a terminal) every plugin is one plain line, its error in full; in a terminal
    of 40 columns the table folds its cells instead of cropping them: every character of a broken
    plugin's distribution, version and error is still there, in order."""
    env = env_for(broken_site)
    plugins = {p["name"]: p for p in json.loads(star("plugins", "--json", env=env, cwd=tmp_path).stdout)}
    broken = [p for p in plugins.values() if p["error"]]
    assert len(broken) == len(BROKEN)
    piped = star("plugins", env=env, cwd=tmp_path)
    assert piped.returncode == 2, piped.stderr  # listed, then: some failed to load
    for p in broken:
        assert f"{p['name']} ({p['distribution']} {p['version']}): ERROR: {p['error']}\n" in piped.stdout
    narrow = star("plugins", env={**env, "TTY_COMPATIBLE": "1", "COLUMNS": "40", "NO_COLOR": "1"}, cwd=tmp_path)
    assert narrow.returncode == 2, narrow.stderr
    assert "┃" in narrow.stdout  # the table, as on a terminal
    assert "…" not in narrow.stdout
    out = _squeezed(re.sub(r"\x1b\[[0-9;]*m", "", narrow.stdout))  # styles (bold titles) away
    for p in broken:  # each cell's pieces, line after line (other cells' pieces in between)
        for cell in (p["name"], p["distribution"], p["version"], p["error"]):
            assert _in_order(_squeezed(cell), out), (cell, narrow.stdout)


@pytest.mark.parametrize("dist,version,package,source,checker,says", BROKEN, ids=["import", "signature", "misspelled"])
def test_broken_plugin_is_fatal_only_when_used(broken_site, tmp_path, dist, version, package, source, checker, says):
    toml = tmp_path / "toy.toml"
    toml.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()))
    env = env_for(broken_site)
    res = star("validate", str(toml), env=env, cwd=tmp_path)  # the others are not in the way
    assert res.returncode == 0, res.stderr
    toml.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix())
                    .replace('filters = ["toy_leak"]', f'filters = ["toy_leak"]\nchecker = "{checker}"'))
    for command in ("validate", "run"):
        res = star(command, str(toml), "--quiet", env=env, cwd=tmp_path) if command == "run" else \
            star(command, str(toml), env=env, cwd=tmp_path)
        err = one_line(res.stderr)
        assert res.returncode == 2
        assert f"task.checker: unknown checker '{checker}'" in err
        assert f"plugin '{package}' ({dist} {version})" in err and all(s in err for s in says), err
    assert not (tmp_path / "run").exists()


def test_broken_modules_from_star_engine_plugins(broken_site, tmp_path):
    """The same modules loaded by STAR_ENGINE_PLUGINS instead of an entry point: reported by
    module name, with the hook."""
    for info in broken_site.glob("*.dist-info"):
        (info / "entry_points.txt").unlink()
    env = env_for(broken_site, "star_gpu_checkers.plugin,star_fussy.plugin,star_typo.plugin")
    res = star("plugins", "--json", env=env, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    plugins = {p["name"]: p for p in json.loads(res.stdout)}
    for dist, version, package, _, _, says in BROKEN:  # noqa: B007
        p = plugins[f"{package}.plugin"]
        assert p["distribution"] == "<STAR_ENGINE_PLUGINS>" and all(s in p["error"] for s in says), p


# ------------------------------------------------------------------ a component that raises in iteration 3

FLAKY = """
    from star_engine import hookimpl
    from star_engine.api import Verdict

    BROKEN = {broken!r}  # which component fails in iteration 3 ("" once fixed)
    STATE = {{"iteration": None}}


    class FlakyExact:
        def check(self, generation, extracted, gold):
            if BROKEN == "checker" and STATE["iteration"] == 3:
                raise RuntimeError("checker lost its regex cache")
            return Verdict(extracted, extracted is not None and extracted.strip() == gold.strip())


    class KeepShort:
        def keep(self, candidates, history):
            if BROKEN == "filter" and any(c.iteration == 3 for c in candidates):
                raise RuntimeError("filter database unreachable")
            return [len(c.rationale) < 200 for c in candidates]


    @hookimpl
    def on_iteration_start(run_dir, iteration):
        STATE["iteration"] = iteration
        if BROKEN == "observer" and iteration == 3:
            raise RuntimeError("tracking server down")


    @hookimpl
    def register_checkers(register):
        register("flaky_exact", FlakyExact)


    @hookimpl
    def register_filters(register):
        register("keep_short", KeepShort)
"""
WHERE = {  # failing component -> (what the error line names, the first iteration-3 file not written)
    "checker": ("checker 'flaky_exact'.check raised RuntimeError: checker lost its regex cache",
                "iterations/003/generated.parquet"),
    "filter": ("filter 'keep_short'.keep raised RuntimeError: filter database unreachable",
               "iterations/003/rationales.parquet"),
    "observer": ("failed in hook on_iteration_start: RuntimeError: tracking server down",
                 "iterations/003/generated.parquet"),
}


def flaky_toml(path: Path, out: Path) -> Path:
    text = TOY_TOML.format(out=out.as_posix()).replace(
        'filters = ["toy_leak"]', 'filters = ["toy_leak", "keep_short"]\nchecker = "flaky_exact"')
    path.write_text(text)
    return path


def files(run: Path, prefix: str = "") -> dict[str, tuple[int, str]]:
    return {p.relative_to(run).as_posix(): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(run.rglob("*")) if p.is_file() and p.relative_to(run).as_posix().startswith(prefix)}


def results(run: Path) -> dict[str, object]:
    """Rows of every Parquet file (wall_seconds aside), train.json (seconds aside), the models."""
    out: dict[str, object] = {}
    for p in sorted(run.rglob("*.parquet")):
        out[p.relative_to(run).as_posix()] = [{k: v for k, v in r.items() if k != "wall_seconds"}
                                              for r in pq.read_table(p).to_pylist()]
    for p in sorted(run.rglob("train.json")):
        out[p.relative_to(run).as_posix()] = {k: v for k, v in json.loads(p.read_text()).items() if k != "seconds"}
    for p in sorted(run.rglob("model.json")):
        out[p.relative_to(run).as_posix()] = p.read_text()
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The experiment with the fixed plugin, run once without interruption."""
    tmp = tmp_path_factory.mktemp("flaky_reference")
    site = tmp / "site"
    install(site, "star-flaky", "1.4.3", "star_flaky", FLAKY.format(broken=""), entry_point="flaky")
    res = star("run", str(flaky_toml(tmp / "toy.toml", tmp / "run")), "--quiet", env=env_for(site), cwd=tmp)
    assert res.returncode == 0, res.stderr
    return results(tmp / "run")


@pytest.mark.parametrize("broken", ["checker", "filter", "observer"])
def test_component_failing_in_iteration_3_then_fixed_resumes_there(tmp_path, uninterrupted, broken):
    site = tmp_path / "site"
    install(site, "star-flaky", "1.4.2", "star_flaky", FLAKY.format(broken=broken), entry_point="flaky")
    toml = flaky_toml(tmp_path / "toy.toml", tmp_path / "run")
    run = tmp_path / "run"
    res = star("run", str(toml), "--quiet", env=env_for(site), cwd=tmp_path)
    assert res.returncode == 2
    err = one_line(res.stderr)
    names, not_written = WHERE[broken]
    assert "plugin 'flaky' (star-flaky 1.4.2)" in err and names in err, err
    assert "plugin.py:" in err  # where in the plugin
    assert (run / "iterations/002/metrics.parquet").exists() and not (run / not_written).exists()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["finished"] is False and "star-flaky==1.4.2" in manifest["requirements"]
    before = files(run, "iterations/00")
    earlier = {rel: v for rel, v in before.items() if rel.startswith(("iterations/000/", "iterations/001/",
                                                                       "iterations/002/"))}

    install(site, "star-flaky", "1.4.3", "star_flaky", FLAKY.format(broken=""), entry_point="flaky")  # the fix
    res = star("run", str(toml), "--quiet", env=env_for(site), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    after = files(run, "iterations/00")
    assert {rel: after.get(rel) for rel in earlier} == earlier  # iterations 0-2 untouched: not redone
    kept3 = {rel for rel in before if rel.startswith("iterations/003/")}
    assert all(after[rel] == before[rel] for rel in kept3 if rel in after)  # iteration 3's finished stages kept
    assert results(run) == uninterrupted
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["finished"] is True and "star-flaky==1.4.3" in manifest["requirements"]
