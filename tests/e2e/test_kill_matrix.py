"""Kill -9 and resume with the real haiku_xmap backend (kill_matrix.py, beside this file).

The default run kills the shortened embedded-default experiment 5 times (at the creation
of the run directory, right after iteration 1's checkpoint appears, and at 3 seeded random
moments in the rest of the run) and checks that the resumed run ends with the reference's
rows, train.json files and bit-identical parameters, with no temporary file left. The full
matrix (every stage boundary + 20 random moments) and the chain killed every half of the base
training's time are ``pytest -m slow``.
"""

from __future__ import annotations

import copy
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from star_testkit import TOY_TOML, cli, load_script, scripted_env

km = load_script(Path(__file__).with_name("kill_matrix.py"))  # beside this file


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return km.shared_reference(tmp_path_factory.getbasetemp() / "kill-matrix")


def test_reference_exercises_every_stage(shared):
    _, ref = shared
    assert not km.check_reference(ref)  # both iterations fine-tune, so kills can hit training
    for rel in km.BOUNDARIES.values():
        assert (ref.run_dir / rel).exists(), rel
    assert not km.temporaries(ref.run_dir)


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
def test_short_kill_matrix(shared):
    matrix, ref = shared
    when = {rel: t for t, rel in ref.timeline}
    kills = matrix.boundary_kills(["start", "checkpoint"], ref)
    # Random moments after iteration 1's fine-tuning: they cannot race the checkpoint kill.
    later = when["iterations/001/train.json"]
    kills += matrix.random_kills(ref, 3, random.Random(11), lo=later + 0.01)
    kills.sort(key=lambda k: (k.name != "start", k.at))
    res, rest = matrix.chain("short", kills)
    assert not rest, "the run finished before every kill landed"
    assert res.finished and len(res.kills) == 5 and res.resumes == 5
    assert [k.name for k in res.kills][:1] == ["start"]
    matrix.compare(res, ref)
    assert res.problems == []
    c = res.comparison
    assert (c.lost, c.duplicated, c.changed, res.orphans) == (0, 0, 0, 0)
    assert c.rows > 100 and c.checkpoints == 4 and c.arrays > 50


def test_comparison_finds_lost_duplicated_changed_rows_and_flipped_bits(shared):
    _, ref = shared
    assert km.compare(ref.snap, ref.snap).problems == []
    bad = copy.deepcopy(ref.snap)
    rel = "iterations/001/rationales.parquet"
    rows = bad.parquet[rel]
    rows.append(dict(rows[0]))  # a duplicate
    del rows[1]  # a lost row
    rows[2] = {**rows[2], "rationale": rows[2]["rationale"] + "!"}  # a changed row
    ck = bad.checkpoints["iterations/002/model"]["arrays"]
    name = sorted(ck)[0]
    flipped = ck[name].copy()
    flipped.view(np.uint8).reshape(-1)[0] ^= 1
    ck[name] = flipped
    del bad.parquet["iterations/002/eval_dev.parquet"]
    c = km.compare(ref.snap, bad)
    assert (c.lost, c.duplicated, c.changed) == (1 + len(ref.snap.parquet["iterations/002/eval_dev.parquet"]), 1, 1)
    assert c.differences == 3
    assert any(f"parameter {name} is not bit-identical" in p for p in c.problems)


def test_script_exits_non_zero_on_differences(monkeypatch, tmp_path, capsys):
    def fake(matrix, names, n_random, seed, **kw):
        totals = km.Totals(kills=len(names) + n_random, boundary_kills=len(names), random_kills=n_random,
                           problems=["iterations/001/rationales.parquet: 1 rows lost"])
        return km.Reference(tmp_path, 1.0, [], km.Snapshot({}, {}, {})), totals

    monkeypatch.setattr(km, "run_matrix", fake)
    assert km.main(["--workdir", str(tmp_path), "--random", "2", "--boundaries", "start"]) == 1
    out = capsys.readouterr().out
    assert "differences: 1" in out and "kills: 3" in out
    monkeypatch.setattr(km, "run_matrix", lambda *a, **k: (fake(*a, **k)[0], km.Totals(kills=3, boundary_kills=1,
                                                                                           random_kills=2)))
    assert km.main(["--workdir", str(tmp_path), "--random", "2", "--boundaries", "start"]) == 0
    assert "differences: 0" in capsys.readouterr().out


def test_run_killed_before_config_json_starts_again(toy_toml):
    """A first start killed after creating the run directory but before config.json
    (the window the 'start' kill aims at) must not brick the run directory."""
    path = toy_toml()
    run = path.parent / "run"
    run.mkdir()
    (run / "events.jsonl").write_text('{"event": "start"}\n')
    (run / "experiment.toml").write_bytes(path.read_bytes())
    (run / ".tmp-experiment.toml.4242").write_bytes(b"half")
    res = cli("run", str(path), "--quiet")
    assert res.returncode == 0, res.stderr
    assert (run / "config.json").exists() and (run / "iterations/003/metrics.parquet").exists()
    assert not list(run.rglob(".tmp-*"))
    # A folder with anything else in it is still refused.
    other = path.parent / "other"
    other.mkdir()
    (other / "events.jsonl").write_text("")
    (other / "notes.txt").write_text("mine")
    path.write_text(TOY_TOML.format(out=other.as_posix()))
    res = cli("run", str(path), "--quiet", env=scripted_env())
    assert res.returncode == 2 and "is not a star-engine run directory" in res.stderr


@pytest.mark.slow
def test_full_kill_matrix(tmp_path):
    res = subprocess.run([sys.executable, km.__file__, "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=1800)
    print(res.stdout[-6000:])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "differences: 0" in res.stdout
    kills = int(res.stdout.split("\nkills: ")[1].split()[0])
    assert kills >= 20 + len(km.BOUNDARIES)


@pytest.mark.slow  # a chain of a dozen or more starts, each compiling again: minutes
def test_kills_more_often_than_base_training_lasts_and_still_finishes(shared):
    """Killed every half of the reference's base-training time (its longest stage), the run
    only finishes because fine-tuning resumes from its snapshots (resume.py), and ends
    with the reference's rows and bit-identical parameters."""
    matrix, ref = shared
    every = 0.5 * km.base_training_seconds(ref)
    res = matrix.periodic_chain(every)
    assert res.finished and res.problems == []
    # base training was killed with a snapshot to resume from (how many times depends on the
    # machine's speed and on what the persistent compilation cache already holds)
    assert sum("base/model.partial" in k.snapshots for k in res.kills) >= 1
    matrix.compare(res, ref)
    assert res.problems == []
    c = res.comparison
    assert (c.lost, c.duplicated, c.changed, res.orphans) == (0, 0, 0, 0) and c.checkpoints == 4


def test_progress_is_a_new_stage_output_or_new_bytes_never_bookkeeping(tmp_path):
    """The periodic chain kills an attempt once it has progressed. Neither what every start
    writes (a new tensorboard file, the manifest, the event log) nor a finished file rewritten
    with the same bytes is progress; otherwise the chain could kill every attempt right after
    start-up, or right after the report's re-render, and never finish."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "train.json").write_bytes(b"{}")
    progress = km.Progress(tmp_path)
    assert not progress.made()
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out.tfevents.1").write_bytes(b"tb")
    (tmp_path / "manifest.json").write_bytes(b"{}")
    (tmp_path / "events.jsonl").write_bytes(b'{"event": "resume"}')
    assert not progress.made()
    tmp = tmp_path / "new.tmp"
    tmp.write_bytes(b"{}")
    tmp.replace(tmp_path / "base" / "train.json")  # a new inode, the same bytes
    assert not progress.made()
    tmp.write_bytes(b'{"steps": 1}')
    tmp.replace(tmp_path / "base" / "train.json")
    assert progress.made()
    progress = km.Progress(tmp_path)
    (tmp_path / "base" / "model.partial").mkdir()
    (tmp_path / "base" / "model.partial" / "state.msgpack").write_bytes(b"snapshot")
    assert progress.made()
