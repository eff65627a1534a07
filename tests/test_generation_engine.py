"""``[generation] engine``: a registered generation engine samples every stage instead of the
backend (the scripted engine of ``star_testkit.scripted`` over the scripted backend): the same
texts, each row recording what produced it, the engine started once and closed however the run
ends, a failed run resumed from its stored chunks; bad tables refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from star_engine import hookimpl
from star_engine.config.registry import Registry
from star_testkit import TOY_TOML, cli, scripted_env

ENGINE = '\nengine = "scripted_engine"\n'


def toml(tmp_path: Path, name: str, generation_extra: str = "", tail: str = "") -> Path:
    text = TOY_TOML.format(out=tmp_path / name).replace("chunk_size = 5\n", "chunk_size = 5\n" + generation_extra)
    path = tmp_path / f"{name}.toml"
    path.write_text(text + tail)
    return path


def texts(run: Path) -> dict[str, list[str]]:
    out = {}
    for f in sorted(run.glob("iterations/*/*.parquet")):
        t = pq.read_table(f)
        col = "rationale" if "rationale" in t.column_names else "generation" if "generation" in t.column_names else None
        if col:
            out[str(f.relative_to(run))] = t.column(col).to_pylist()
    return out


def test_an_engine_samples_every_stage_and_each_row_names_it(tmp_path):
    plain, engine = toml(tmp_path, "plain"), toml(tmp_path, "engine", ENGINE)
    assert cli("run", str(plain)).returncode == 0
    res = cli("run", str(engine))
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = texts(tmp_path / "plain"), texts(tmp_path / "engine")
    assert a == b and any("generated" in k for k in a)
    log = (tmp_path / "engine" / "engine.log").read_text().splitlines()
    assert log[0] == "start" and log[-1] == "close" and log.count("start") == 1 and log.count("close") == 1
    assert sum(line.startswith("generate") for line in log) >= 3  # evaluation, generation, rationalization
    rows = pq.read_table(tmp_path / "engine" / "iterations" / "001" / "generated.parquet").to_pylist()
    assert rows and all(r["sampled_by"] == "scripted-engine" and r["model_version"].startswith("v-") for r in rows)
    plain_rows = pq.read_table(tmp_path / "plain" / "iterations" / "001" / "generated.parquet").to_pylist()
    assert all(r["sampled_by"] == "" and r["model_version"] == "" for r in plain_rows)  # the backend's sampler
    manifest = json.loads((tmp_path / "engine" / "manifest.json").read_text())
    assert {r["model_version"] for r in rows} <= set(manifest["served_models"])
    assert all(v["sampled_by"] == "scripted-engine" and v["checkpoint"] for v in manifest["served_models"].values())
    evals = pq.read_table(tmp_path / "engine" / "iterations" / "001" / "eval_dev.parquet").to_pylist()
    assert evals and all(r["sampled_by"] == "scripted-engine" for r in evals)


def test_a_failing_engine_is_closed_and_the_rerun_resumes_from_the_stored_chunks(tmp_path):
    failing = toml(tmp_path, "run", ENGINE)
    res = cli("run", str(failing), env=scripted_env(SCRIPTED_ENGINE_FAIL_AT="5"))  # a generation chunk stored
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr[-2000:]
    assert "server scripted-engine: HTTP 503: overloaded" in res.stderr
    run = tmp_path / "run"
    log = (run / "engine.log").read_text().splitlines()
    assert log[-1] == "close" and sum(line.startswith("generate") for line in log) == 5
    chunks = {p: p.read_bytes() for p in run.glob("iterations/**/chunk-*.parquet")}
    assert chunks  # the chunks sampled before the failure are kept
    res = cli("run", str(failing))
    assert res.returncode == 0, res.stderr[-2000:]
    log = (run / "engine.log").read_text().splitlines()
    assert log.count("start") == 2 and log[-1] == "close"
    plain = toml(tmp_path, "plain")
    assert cli("run", str(plain)).returncode == 0
    assert texts(run) == texts(tmp_path / "plain")


def test_a_server_table_without_an_engine_is_refused_and_nothing_written(tmp_path):
    res = cli("run", str(toml(tmp_path, "run", '\nserver = { url = "http://localhost:8000" }\n')))
    assert res.returncode == 2 and res.stderr.startswith(f"error: {tmp_path / 'run.toml'}: generation.server: "), res.stderr
    assert res.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_an_unknown_engine_names_the_key(tmp_path):
    res = cli("run", str(toml(tmp_path, "run", '\nengine = "vllm_direct"\n')))
    assert res.returncode == 2 and "generation.engine" in res.stderr and "vllm_direct" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def test_an_engine_option_it_does_not_declare_names_the_key(tmp_path):
    res = cli("run", str(toml(tmp_path, "run", ENGINE + "server = { fail_after = 3 }\n")))  # tag is its one option
    assert res.returncode == 2 and "generation.server.fail_after" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()


class EchoEngine:
    def __init__(self, prefix: str = ""):
        self.prefix = prefix


class EnginePlugin:
    @hookimpl
    def register_engines(self, register):
        register("echo", EchoEngine)


def test_a_plugin_registers_an_engine_through_register_engines(monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    reg = Registry(autoload=False)
    reg.add(EnginePlugin())
    engine = reg.create("engine", "echo", {"prefix": ">"}, "generation.engine", "generation.server")
    assert isinstance(engine, EchoEngine) and engine.prefix == ">"
