"""A checker's optional ``check_many`` (``capabilities.ChecksMany``): the core hands it a stage's
generations at once (so that a checker can judge them in parallel, as ``python_tests`` does with
``workers``), and a run judged through it is the run judged one at a time; a checker that asks
for the context (``check_in``) is asked one at a time; a wrong answer is the plugin's fault."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main

PLUGIN = textwrap.dedent('''
    import json
    import os

    from star_engine import Verdict, hookimpl


    def exact(extracted, gold):
        return Verdict(extracted, extracted is not None and extracted.strip() == gold.strip())


    class Many:
        """toy_exact's verdicts, through check_many; each call's batch size is logged."""

        def __init__(self, log: str = "", short: bool = False):
            self.log, self.short = log, short

        def check(self, generation, extracted, gold):
            raise AssertionError("the core judges a stage through check_many")

        def check_many(self, items):
            with open(self.log, "a") as f:
                f.write(json.dumps(len(items)) + "\\n")
            out = [exact(e, g) for _, e, g in items]
            return out[:-1] if self.short else out


    class ManyInContext(Many):
        def check_in(self, context, generation, extracted, gold):
            return exact(extracted, gold)


    @hookimpl
    def register_checkers(register):
        register("many", Many)
        register("many_in_context", ManyInContext)
''')


@pytest.fixture
def many(scripted, monkeypatch, tmp_path):
    (tmp_path / "check_many_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", "star_testkit.scripted,check_many_plugin")


def toy(toy_toml, out: str, checker: str) -> Path:
    path = toy_toml(out, name=f"{out}.toml")
    text = path.read_text().replace('dataset = "toy"', f'dataset = "toy"\nchecker = {checker}')
    text = text.replace("batch_size = 4\n", "batch_size = 4\ntemperature = 0.7\nsamples_per_question = 3\n", 1)
    path.write_text(text)
    return path


def verdicts(run: Path) -> list[tuple]:
    out = []
    for f in sorted(run.glob("iterations/*/*.parquet")):
        if f.name.startswith(("generated", "rationalized", "eval_")):
            out += [(f.parent.name, f.name, r["question_id"], r.get("sample"), r["predicted"], r["correct"])
                    for r in pq.read_table(f).to_pylist()]
    return out


def test_a_stage_is_judged_through_check_many_at_once_as_one_at_a_time(many, toy_toml, tmp_path):
    log = tmp_path / "batches.jsonl"
    assert main(["run", str(toy(toy_toml, "many", f'{{ name = "many", log = "{log.as_posix()}" }}')), "--quiet"]) == 0
    assert main(["run", str(toy(toy_toml, "one", '"toy_exact"')), "--quiet"]) == 0
    got, want = verdicts(tmp_path / "many"), verdicts(tmp_path / "one")
    assert got == want and any(v[-1] for v in got) and not all(v[-1] for v in got)
    batches = [json.loads(line) for line in log.read_text().splitlines()]
    # generation: 3 samples of each drawn question in one call; the evaluations likewise
    generated = len(pq.read_table(tmp_path / "many/iterations/001/generated.parquet"))
    assert generated in batches and max(batches) >= generated > 1


def test_a_checker_that_asks_for_the_context_is_asked_one_at_a_time(many, toy_toml, tmp_path):
    log = tmp_path / "batches.jsonl"
    path = toy(toy_toml, "ctx", f'{{ name = "many_in_context", log = "{log.as_posix()}" }}')
    assert main(["run", str(path), "--quiet"]) == 0
    assert not log.exists()  # check_in, one generation at a time, with where it comes from


def test_check_many_that_answers_one_verdict_short_is_the_plugins_fault(many, toy_toml, tmp_path, capsys):
    log = tmp_path / "batches.jsonl"
    path = toy(toy_toml, "short", f'{{ name = "many", log = "{log.as_posix()}", short = true }}')
    assert main(["run", str(path), "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "check_many" in err and "check_many_plugin" in err
