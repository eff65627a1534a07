"""The question-sampler hook (register_samplers): chosen in the TOML, fed the per-question
ledger, checked, and the built-in "uniform" equal to drawing without a sampler."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine import hookimpl
from star_engine.cli import main
from star_engine.rundir.ledger import latest
from star_engine.config.registry import Registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
SUBSET = "chunk_size = 5\nn_train_samples = 10"


def with_samplers(monkeypatch, extra: str = "") -> None:
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", ",".join(filter(None, ["star_testkit.scripted", "star_samplers.plugin",
                                                                      extra])))


def run(toy_toml, out: str, sampler: str | None) -> Path:
    path = toy_toml(out=out, name=f"{out}.toml")
    text = path.read_text().replace("chunk_size = 5", SUBSET + (f"\nsampler = {sampler}" if sampler else ""))
    path.write_text(text.replace("iterations = 3", "iterations = 4"))
    assert main(["run", str(path), "--quiet"]) == 0
    return path.parent / out


def drawn(run_dir: Path, n: int) -> list[str]:
    return sorted({r["question_id"] for r in pq.read_table(run_dir / f"iterations/{n:03d}/generated.parquet")
                   .to_pylist()})


def test_uniform_sampler_equals_no_sampler(scripted, toy_toml, monkeypatch):
    with_samplers(monkeypatch)
    a, b = run(toy_toml, "none", None), run(toy_toml, "uniform", '"uniform"')
    for n in (1, 2, 3, 4):
        assert drawn(a, n) == drawn(b, n) and len(drawn(a, n)) == 10
        for name in ("rationales", "metrics", "questions"):
            ta = pq.read_table(a / f"iterations/{n:03d}/{name}.parquet").to_pylist()
            tb = pq.read_table(b / f"iterations/{n:03d}/{name}.parquet").to_pylist()
            for r in ta + tb:
                r.pop("wall_seconds", None)
            assert ta == tb


def test_adaptive_sampler_reads_the_ledger(scripted, toy_toml, monkeypatch):
    with_samplers(monkeypatch)
    uni, ada = run(toy_toml, "uni", '"uniform"'), run(toy_toml, "ada", '{ name = "adaptive", floor = 0.01 }')
    assert (ada / "config.json").read_text().count('"adaptive"') == 1
    assert len(drawn(ada, 1)) == 10
    from star_samplers.samplers import AdaptiveSampler
    from star_testkit import scripted_plugin_examples

    ledger = pq.read_table(ada / "questions.parquet").to_pylist()
    questions = scripted_plugin_examples()
    for n in (2, 3, 4):
        before = [r for r in ledger if r["iteration"] < n]
        assert drawn(ada, n) == sorted(AdaptiveSampler(floor=0.01).select(n, questions, 10, before, 7))
    # Its draws differ from uniform's once the ledger has something to say.
    assert any(drawn(ada, n) != drawn(uni, n) for n in (2, 3, 4))


class Bad:
    def __init__(self, *, mode: str = "unknown"):
        self.mode = mode

    def select(self, iteration, questions, n, ledger, seed):
        return {"unknown": ["nope"], "dupes": [questions[0].id] * 2, "many": [q.id for q in questions]}[self.mode]


bad_plugin = types.ModuleType("bad_sampler_plugin")


@hookimpl
def _register(register):
    register("bad", Bad)


bad_plugin.register_samplers = _register


@pytest.mark.parametrize("mode", ["unknown", "dupes", "many"])
def test_a_sampler_returning_bad_ids_stops_the_run_naming_it(scripted, toy_toml, monkeypatch, capsys, mode):
    monkeypatch.setitem(__import__("sys").modules, "bad_sampler_plugin", bad_plugin)
    with_samplers(monkeypatch, "bad_sampler_plugin")
    path = toy_toml()
    sampler = f'\nsampler = {{ name = "bad", mode = "{mode}" }}'
    path.write_text(path.read_text().replace("chunk_size = 5", SUBSET + sampler))
    assert main(["run", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "generation.sampler: sampler 'bad'.select must return at most 10 distinct ids" in err


def test_the_documented_sampler_works():
    doc = DOC.read_text()
    source = re.search(r"### `register_samplers`.*?```python\n.*?```.*?```python\n(.*?)```", doc, re.DOTALL).group(1)
    module = types.ModuleType("doc_sampler")
    module.hookimpl = hookimpl
    exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    reg = Registry(autoload=False)
    assert reg.add(module).components == {"sampler": ["hardest_first"]}
    from star_testkit import scripted_plugin_examples

    qs = scripted_plugin_examples()
    ledger = [{"iteration": 1, "question_id": q.id, "times_solved": int(i % 2 == 0)} for i, q in enumerate(qs)]
    ids = reg.create("sampler", "hardest_first", {}, "generation.sampler").select(2, qs, 5, ledger, 0)
    assert all(latest(ledger)[i]["times_solved"] == 0 for i in ids) and len(ids) == 5


def test_plugins_lists_the_hook_and_the_builtins():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    res = subprocess.run([sys.executable, "-m", "star_engine", "plugins", "--json"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    (samplers,) = [p for p in json.loads(res.stdout) if p["name"] == "samplers"]
    assert samplers["hooks"] == ["register_samplers"] and samplers["error"] is None
    assert samplers["components"] == {"sampler": ["uniform", "adaptive", "curriculum", "stratified"]}
