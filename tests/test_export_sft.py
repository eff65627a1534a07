"""``star-engine export RUN_DIR --sft``: the kept rationales as JSON Lines in TRL's
prompt-completion and conversational (``messages``) types, one iteration's fine-tuning set
exactly as the run trained on it, the few-shot prefix on request, and bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_testkit import scripted_env
from star_testkit.scripted import ToyTask

DOC = Path(__file__).resolve().parents[1] / "docs" / "ledger.md"
PLAIN, HINTED = ToyTask().prompt("rationale"), ToyTask().prompt("hint")


def run(toy_toml, *overrides: str, out: str = "run") -> Path:
    path = toy_toml(out=out, name=f"{out}.toml")
    args = ["run", str(path), "--quiet"]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    return path.parent / out


@pytest.fixture
def run_dir(scripted, toy_toml) -> Path:
    return run(toy_toml)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kept(run: Path, iteration: int) -> list[dict]:
    rows = pq.read_table(run / f"iterations/{iteration:03d}/rationales.parquet").to_pylist()
    return [r for r in rows if r["kept"]]


def test_prompt_completion_is_every_kept_rationale_once(run_dir, capsys):
    assert main(["export", str(run_dir), "--sft"]) == 0
    got = lines(run_dir / "sft.jsonl")
    assert capsys.readouterr().out.strip() == f"wrote {len(got)} prompt-completion examples to {run_dir / 'sft.jsonl'}"
    assert got and all(list(x) == ["prompt", "completion"] for x in got)
    pairs = [(x["prompt"], x["completion"]) for x in got]
    every = [(r["prompt"], r["rationale"]) for n in (1, 2, 3) for r in kept(run_dir, n)]
    assert len(every) > len(set(every))  # the same text is kept in several iterations...
    assert pairs == list(dict.fromkeys(every))  # ...and written once, earliest first
    assert all(p.startswith("Q: ") and p.endswith("\nA:") and "hint" not in p for p, _ in pairs)


def test_one_iteration_is_exactly_what_it_trained_on(run_dir, capsys):
    out = run_dir / "it2.jsonl"
    assert main(["export", str(run_dir), "--sft", "--iteration", "2", "--out", str(out)]) == 0
    got = lines(out)
    assert [(x["prompt"], x["completion"]) for x in got] == [(r["prompt"], r["rationale"]) for r in kept(run_dir, 2)]
    # The scripted model of iteration 2 (restarted from the base) learned exactly these examples.
    trained = json.loads((run_dir / "iterations/002/train.json").read_text())
    learned = json.loads((run_dir / "iterations/002/model/model.json").read_text())["learned"]
    assert len(got) == trained["examples"] and {x["prompt"]: x["completion"] for x in got} == learned
    assert f"wrote {len(got)} prompt-completion examples" in capsys.readouterr().out


def test_messages_format(run_dir):
    assert main(["export", str(run_dir), "--sft", "--format", "messages", "--iteration", "1"]) == 0
    got = lines(run_dir / "sft_messages.jsonl")
    want = [{"messages": [{"role": "user", "content": r["prompt"].strip()},
                          {"role": "assistant", "content": r["rationale"].strip()}]} for r in kept(run_dir, 1)]
    assert got == want and kept(run_dir, 1)[0]["rationale"].startswith(" ")  # stored with its space, written without
    assert not (run_dir / "sft.jsonl").exists()


def test_few_shot_prefix_follows_the_stored_prompt(scripted, toy_toml):
    # p_show_hint_save = 0.5: some rationalized rows are stored with their hinted context; those
    # take the hinted few-shot prompt, every other row the plain one.
    r = run(toy_toml, "rationalization.p_show_hint_save=0.5")
    assert main(["export", str(r), "--sft", "--few-shot", "--out", str(r / "fs.jsonl")]) == 0
    assert main(["export", str(r), "--sft", "--out", str(r / "plain.jsonl")]) == 0
    with_prefix, stored = lines(r / "fs.jsonl"), lines(r / "plain.jsonl")
    assert len(with_prefix) == len(stored)
    shown = 0
    for a, b in zip(with_prefix, stored):
        prefix = HINTED if "(hint:" in b["prompt"] else PLAIN
        shown += prefix == HINTED
        assert a == {"prompt": prefix + b["prompt"], "completion": b["completion"]}
    assert 0 < shown < len(stored)


def test_few_shot_when_the_run_stored_it_already(scripted, toy_toml, capsys):
    r = run(toy_toml, "task.few_shot_train=true", "experiment.iterations=1")
    assert main(["export", str(r), "--sft", "--few-shot"]) == 0
    assert "already hold the few-shot prefix" in capsys.readouterr().out
    got = lines(r / "sft.jsonl")
    assert got and all(x["prompt"].startswith(PLAIN) and x["prompt"].count("Q: ") == 2 for x in got)


def test_zero_rows_say_why(scripted, toy_toml, capsys):
    none_kept = run(toy_toml, "rationalization.enabled=false", "model.easy_mod=1000003",
                    "experiment.iterations=1", out="never")
    assert main(["export", str(none_kept), "--sft"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("wrote 0 prompt-completion examples") and "none of the 24 rationales of iterations 1-1" \
        in out and (none_kept / "sft.jsonl").read_text() == ""
    assert main(["export", str(none_kept), "--pairs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wrote 0 pairs") and "(none of the 24 rationales of iteration 1 was kept; " in out
    # A run killed in its first generation (after the 12 dev questions of iteration 0's evaluation).
    path = toy_toml(out="killed", name="killed.toml")
    proc = subprocess.run([sys.executable, "-m", "star_engine", "run", str(path), "--quiet"],
                          env=scripted_env(SCRIPTED_KILL="generate:13"), capture_output=True, timeout=300)
    killed = path.parent / "killed"
    assert proc.returncode == -9 and (killed / "manifest.json").is_file()
    assert not (killed / "iterations/001/rationales.parquet").exists()
    assert main(["export", str(killed), "--sft"]) == 0
    assert "wrote 0 prompt-completion examples" in (out := capsys.readouterr().out)
    assert "(no iteration has selected its fine-tuning set yet)" in out
    assert main(["export", str(killed), "--pairs"]) == 0
    assert "wrote 0 pairs" in (out := capsys.readouterr().out) and "no iteration has selected" in out


def test_bad_input_is_one_line_exit_2(run_dir, tmp_path, capsys):
    def refused(args: list[str], message: str) -> str:
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        return err

    refused([str(tmp_path / "nope"), "--sft"], "no such run directory")
    refused([str(tmp_path), "--sft"], "not a run directory")
    assert "(iterations selected: 1, 2, 3)" in refused([str(run_dir), "--sft", "--iteration", "9"], "--iteration 9: ")
    refused([str(run_dir), "--sft", "--iteration", "0"], "--iteration: must be >= 1")
    refused([str(run_dir), "--pairs", "--iteration", "1"], "--iteration: only with --sft")
    refused([str(run_dir), "--pairs", "--few-shot"], "--few-shot: only with --sft")
    refused([str(run_dir), "--pairs", "--format", "messages"], "--format: only with --sft")
    refused([str(run_dir), "--sft", "--max-pairs-per-question", "2"], "only with --pairs")
    refused([str(run_dir)], "--pairs or --sft")
    (tmp_path / "a_dir").mkdir()
    refused([str(run_dir), "--sft", "--out", str(tmp_path / "a_dir")], "exists and is not a file")
    refused([str(run_dir), "--sft", "--pairs"], "exclude each other")
    victim = run_dir / "iterations/001/rationales.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    refused([str(run_dir), "--sft"], "checksum")
    assert not (run_dir / "sft.jsonl").exists()


def test_documented(run_dir):
    doc = DOC.read_text().split("## Kept rationales for supervised fine-tuning", 1)[1]
    for needle in ("--sft", "--iteration", "--format messages", "--few-shot", '"prompt"', '"completion"',
                   '"messages"', "few_shot_train", "sft.jsonl", "sft_messages.jsonl"):
        assert needle in doc, needle
