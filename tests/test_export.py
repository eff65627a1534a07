"""``star-engine export RUN_DIR --pairs``: the documented JSON Lines format, every pair a kept
rationale against a wrong one of the same question and prompt, and bad input refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.cli import main
from star_engine.report.export import PAIR_FIELDS

DOC = Path(__file__).resolve().parents[1] / "docs" / "ledger.md"


@pytest.fixture
def run_dir(scripted, toy_toml) -> Path:
    path = toy_toml()
    path.write_text(path.read_text().replace("chunk_size = 5", "chunk_size = 5\nsamples_per_question = 2\n"
                                             "temperature = 0.5"))
    assert main(["run", str(path), "--quiet"]) == 0
    return path.parent / "run"


def candidates(run: Path) -> list[dict]:
    return [r for n in (1, 2, 3) for r in pq.read_table(run / f"iterations/{n:03d}/rationales.parquet").to_pylist()]


def test_wrong_rationales_stay_with_their_verdict(run_dir):
    wrong = [r for r in candidates(run_dir) if not r["correct"]]
    assert wrong and all(not r["kept"] and r["rejected_by"] == "checker" and r["predicted"] != r["gold"]
                         for r in wrong)


def test_pairs_are_every_kept_against_every_wrong(run_dir, capsys):
    assert main(["export", str(run_dir), "--pairs"]) == 0
    assert "pairs to" in capsys.readouterr().out
    lines = (run_dir / "pairs.jsonl").read_text().splitlines()
    pairs = [json.loads(line) for line in lines]
    assert pairs and all(tuple(p) == PAIR_FIELDS for p in pairs)
    # Brute force: per question and prompt, distinct kept texts x distinct wrong texts.
    want = set()
    for c in candidates(run_dir):
        for w in candidates(run_dir):
            if c["kept"] and not w["correct"] and c["question_id"] == w["question_id"] and c["prompt"] == w["prompt"]:
                want.add((c["question_id"], c["prompt"], c["rationale"], w["rationale"]))
    got = [(p["question_id"], p["prompt"], p["chosen"], p["rejected"]) for p in pairs]
    assert len(got) == len(set(got)) and set(got) == want
    by_text = {(r["question_id"], r["rationale"]): r for r in candidates(run_dir)}
    for p in pairs:
        c, w = by_text[(p["question_id"], p["chosen"])], by_text[(p["question_id"], p["rejected"])]
        assert c["kept"] and c["correct"] and not w["correct"] and p["gold"] == c["gold"] == w["gold"]
        assert p["rejected_predicted"] != p["gold"] and p["class"] == c["class"]
        assert "hint" not in p["prompt"]  # the hint-free context (p_show_hint_save = 0)
    # Every field is documented in the format table.
    doc = DOC.read_text().split("## Wrong rationales and preference pairs", 1)[1]
    assert all(re.search(rf"`{f}`", doc) for f in PAIR_FIELDS)


def test_cap_and_out(run_dir, tmp_path):
    out = tmp_path / "p.jsonl"
    assert main(["export", str(run_dir), "--pairs", "--out", str(out), "--max-pairs-per-question", "1"]) == 0
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    per_q = [p["question_id"] for p in pairs]
    assert pairs and len(per_q) == len(set(per_q))
    # Each question's pair is its first of the uncapped export (the earliest).
    assert main(["export", str(run_dir), "--pairs"]) == 0
    first: dict[str, dict] = {}
    for line in (run_dir / "pairs.jsonl").read_text().splitlines():
        p = json.loads(line)
        first.setdefault(p["question_id"], p)
    assert pairs == [first[q] for q in per_q] and set(per_q) == set(first)


def test_bad_input_is_one_line_exit_2(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir)]) == 2
    assert "--pairs" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nope"), "--pairs"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    victim = run_dir / "iterations/002/rationales.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    (run_dir / "pairs.jsonl").unlink(missing_ok=True)
    assert main(["export", str(run_dir), "--pairs"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(victim) in err and "checksum" in err and len(err.splitlines()) == 1
    assert not (run_dir / "pairs.jsonl").exists()
    assert main(["export", str(run_dir), "--pairs", "--max-pairs-per-question", "-1"]) == 2


@pytest.mark.parametrize("overrides,why", [
    (["rationalization.enabled=false", "model.easy_mod=1000003"],
     "none of the 24 rationales of iteration 1 was kept; a pair is a kept and a wrong rationale of one question"),
    (["model.easy_mod=1"],
     "none of the 24 rationales of iteration 1 was wrong; a pair is a kept and a wrong rationale of one question"),
    (['training.source="gold"', "task.filters=[]", "rationalization.enabled=false"],
     'iteration 1 trained on the task\'s gold completions (training.source = "gold"): no rationale to pair'),
    (["model.easy_mod=1000003", "rationalization.p_show_hint_save=1.0"],  # kept: hinted prompts only
     "11 kept and 24 wrong rationales in iteration 1, but no question has both stored with the same prompt"),
], ids=["none_kept", "none_wrong", "gold", "no_shared_prompt"])
def test_zero_pairs_say_why(scripted, toy_toml, overrides, why):
    """As a process: exit 0, an empty file, and the reason on stdout."""
    from star_testkit import cli

    path = toy_toml()
    args = ["run", str(path), "--quiet", "--set", "experiment.iterations=1"]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    run = path.parent / "run"
    res = cli("export", str(run), "--pairs")
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout == f"wrote 0 pairs to {run / 'pairs.jsonl'} ({why})\n"
    assert (run / "pairs.jsonl").read_text() == ""
