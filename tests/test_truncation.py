"""Prompts cut without a word (issue 31, item 3): a backend that keeps at most
``prompt_capacity(spec)`` tokens of a prompt has every longer one counted, per stage: a flag in
each row (``prompt_truncated``), a count in ``metrics.parquet`` (``prompts_truncated``) and in
the ``iteration_done`` event, and one ``prompts_truncated`` warning from each stage that cut any.
The scripted ``scripted_ctx`` backend counts characters against a context of ``context``."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from star_engine.cli import main
from star_testkit.scripted import ScriptedContextBackend, ToyHint, ToyTask

NEW_TOKENS = 32  # TOY_TOML's generation.max_new_tokens


def _rows(path):
    return pq.read_table(path).to_pylist()


def _events(run):
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def _capacity_that_cuts_some() -> int:
    """A capacity that the longer of the toy task's train prompts exceed and the shorter do not."""
    task = ToyTask()
    lengths = sorted(len(task.prompt("rationale") + task.context(e)) for e in task.load("train", None))
    cap = lengths[len(lengths) // 2]
    assert lengths[0] <= cap < lengths[-1]
    return cap


def test_prompts_longer_than_the_backend_keeps_are_counted_per_stage(scripted, toy_toml, tmp_path):
    cap = _capacity_that_cuts_some()
    model = f'model={{backend = "scripted_ctx", context = {cap + NEW_TOKENS}}}'
    assert main(["run", str(toy_toml()), "--quiet", "--set", model, "--set", "experiment.iterations=1"]) == 0
    run = tmp_path / "run"
    task, hint = ToyTask(), ToyHint()
    train = {e.id: e for e in task.load("train", None)}
    dev = {e.id: e for e in task.load("dev", None)}
    gen = _rows(run / "iterations/001/generated.parquet")
    rat = _rows(run / "iterations/001/rationalized.parquet")
    ev = _rows(run / "iterations/001/eval_dev.parquet")
    # Each row's flag is its full prompt's length against the capacity.
    for r in gen:
        assert r["prompt_truncated"] == (len(task.prompt("rationale") + task.context(train[r["question_id"]])) > cap)
    for r in rat:
        assert r["prompt_truncated"] == (len(task.prompt("hint") + hint.context(task, train[r["question_id"]])) > cap)
    for r in ev:
        assert r["prompt_truncated"] == (len(task.prompt("rationale") + task.context(dev[r["question_id"]])) > cap)
    cut = {"generate": sum(r["prompt_truncated"] for r in gen), "rationalize": sum(r["prompt_truncated"] for r in rat),
           "evaluate dev": sum(r["prompt_truncated"] for r in ev)}
    assert 0 < cut["generate"] < len(gen) and cut["rationalize"] > 0 and cut["evaluate dev"] > 0
    # metrics.parquet: train rows the generate stage's, *_r rows the rationalize stage's, eval rows the evaluation's.
    metrics = {(m["iteration"], m["split"], m["class"]): m for m in _rows(run / "metrics.parquet")}
    assert metrics[(1, "train", "all")]["prompts_truncated"] == cut["generate"]
    assert metrics[(1, "train", "all_r")]["prompts_truncated"] == cut["rationalize"]
    assert metrics[(1, "dev", "all")]["prompts_truncated"] == cut["evaluate dev"]
    per_class = [m["prompts_truncated"] for (i, s, c), m in metrics.items() if (i, s) == (1, "train") and c not in
                 ("all", "all_r") and not c.endswith("_r")]
    assert sum(per_class) == cut["generate"]
    # The events: one warning per stage that cut any (with the count and the capacity), the counts per stage.
    events = _events(run)
    warned = [e for e in events if e["event"] == "prompts_truncated"]
    assert all(e["level"] == "warning" and e["capacity"] == cap for e in warned)
    assert {(e["iteration"], e["stage"]): e["prompts"] for e in warned if e["iteration"] == 1} == \
        {(1, stage): n for stage, n in cut.items()}
    done = {e["iteration"]: e for e in events if e["event"] == "iteration_done"}
    assert done[1]["prompts_truncated"] == cut and done[0]["prompts_truncated"] == {"evaluate dev": cut["evaluate dev"]}


def test_nothing_cut_nothing_warned_and_no_capacity_no_count(scripted, toy_toml, tmp_path):
    big = f'model={{backend = "scripted_ctx", context = {10_000}}}'
    assert main(["run", str(toy_toml()), "--quiet", "--set", big, "--set", "experiment.iterations=1"]) == 0
    run = tmp_path / "run"
    assert not [e for e in _events(run) if e["event"] == "prompts_truncated"]
    assert {m["prompts_truncated"] for m in _rows(run / "metrics.parquet")} == {0}
    # The scripted backend says nothing of a capacity: nothing is counted (null, not 0).
    path = toy_toml(out="plain", name="plain.toml")
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    plain = tmp_path / "plain"
    assert {r["prompt_truncated"] for r in _rows(plain / "iterations/001/generated.parquet")} == {None}
    assert {m["prompts_truncated"] for m in _rows(plain / "metrics.parquet")} == {None}


def test_a_capacity_that_is_not_a_count_is_the_plugins_error(scripted, toy_toml, monkeypatch, capsys):
    monkeypatch.setattr(ScriptedContextBackend, "prompt_capacity", lambda self, spec: "lots")
    assert main(["run", str(toy_toml()), "--quiet", "--set", 'model={backend = "scripted_ctx"}']) == 2
    assert "backend prompt_capacity returned 'lots'" in capsys.readouterr().err


def test_the_haiku_backend_keeps_its_context_less_the_new_tokens():
    from star_engine.api import GenSpec
    from star_haiku_xmap.plugin import HaikuXmapBackend

    backend = HaikuXmapBackend.from_table()  # the tiny preset: n_ctx 512, byte tokenizer
    assert backend.prompt_capacity(GenSpec(96, 0.0, 1.0, (), 8)) == 512 - 96
    assert backend.count_tokens(["é" * 3]) == [6]  # bytes: what generate encodes and cuts
