"""The tracking plugin on the scripted toy run: event files read back, resume, and
the plugin without its optional tensorboardX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_testkit import TESTS, TOY_TOML
from star_engine.cli import main
from star_tracking import tracker
from star_tracking.events import read_records, read_scalars

pytest.importorskip("tensorboardX", reason="the [tensorboard] extra is not installed")

PLUGINS = "star_testkit.scripted,star_tracking.plugin"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    monkeypatch.setenv("STAR_ENGINE_DISABLE_AUTOLOAD", "1")
    monkeypatch.setenv("STAR_ENGINE_PLUGINS", PLUGINS)
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delenv("SCRIPTED_KILL", raising=False)
    path = tmp_path / "toy.toml"
    path.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()))
    return path


def metrics(run: Path) -> list[dict]:
    return pq.read_table(run / "metrics.parquet").to_pylist()


def test_event_files_hold_the_run(toy):
    assert main(["run", str(toy), "--quiet"]) == 0
    run = toy.parent / "run"
    state = json.loads((run / "tracking.json").read_text())
    assert state["tensorboard"] is True and state["logdir"] == "tensorboard"
    assert state["library"].startswith("tensorboardX ") and state["iterations"] == [0, 1, 2, 3]
    assert state["finished"] is True
    scalars = read_scalars(run / "tensorboard")
    rows = metrics(run)
    for r in rows:
        tag = f"accuracy/{r['split']}/{r['class']}"
        if r["accuracy"] is not None:
            assert (r["iteration"], pytest.approx(r["accuracy"], abs=1e-6)) in scalars[tag], tag
    dev = [(r["iteration"], r["accuracy"]) for r in rows if r["split"] == "dev" and r["class"] == "all"]
    assert [s for s, _ in scalars["accuracy/dev/all"]] == [0, 1, 2, 3]
    assert [v for _, v in scalars["accuracy/dev/all"]] == pytest.approx([a for _, a in dev], abs=1e-6)
    train = {r["iteration"]: r for r in rows if r["split"] == "train" and r["class"] == "all"}
    assert scalars["rationales/kept/all"] == [(n, float(train[n]["kept"])) for n in (1, 2, 3)]
    assert scalars["rationales/rationalized/all"] == [(n, float(train[n]["rationalized"])) for n in (1, 2, 3)]
    assert any(train[n]["rationalized"] for n in train) and any(train[n]["kept"] for n in train)
    assert "accuracy/train/all_r" in scalars and "accuracy/dev/3" in scalars  # hinted and per-class rows
    for n in (1, 2, 3):
        losses = json.loads((run / f"iterations/{n:03d}/train.json").read_text())["losses"]
        assert len(losses) == 3 * n  # the toy_linear schedule
        curve = scalars[f"loss/iteration_{n:03d}"]
        assert [s for s, _ in curve] == list(range(1, 3 * n + 1))
        assert [v for _, v in curve] == pytest.approx(losses, rel=1e-6)
    assert scalars["train/steps"] == [(0, 0.0), (1, 3.0), (2, 6.0), (3, 9.0)]
    assert scalars["best_accuracy/dev"] == [(3, pytest.approx(max(a for _, a in dev), abs=1e-6))]
    assert "loss/base_training" not in scalars  # the toy run trains no base model


def test_base_training_curve(toy):
    toy.write_text(toy.read_text() + "\n[base_training]\nsteps = 4\n")
    assert main(["run", str(toy), "--quiet", "--set", "experiment.iterations=1"]) == 0
    run = toy.parent / "run"
    losses = json.loads((run / "base/train.json").read_text())["losses"]
    scalars = read_scalars(run / "tensorboard")
    assert scalars["loss/base_training"] == [(i, pytest.approx(x, rel=1e-6)) for i, x in enumerate(losses, 1)]
    assert len(losses) == 4 and "rationales/rationalized/all_r" not in scalars
    assert scalars["rationales/kept/all_r"][0][0] == 1


def test_resume_logs_nothing_twice(toy):
    assert main(["run", str(toy), "--quiet", "--set", "experiment.iterations=2"]) == 0
    run = toy.parent / "run"
    assert json.loads((run / "tracking.json").read_text())["iterations"] == [0, 1, 2]
    assert main(["run", str(toy), "--quiet"]) == 0  # resumes: iterations 0-2 are replayed to observers
    assert main(["run", str(toy), "--quiet"]) == 0  # a finished run: everything is replayed
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 3
    scalars = read_scalars(run / "tensorboard")
    for tag, points in scalars.items():
        dup = [s for s, k in Counter(s for s, _ in points).items() if k > 1]
        assert not dup, (tag, dup)
    assert [s for s, _ in scalars["accuracy/dev/all"]] == [0, 1, 2, 3]
    # written when each invocation finished new work (2 iterations, then extended to 3), not on the rerun
    assert [s for s, _ in scalars["best_accuracy/dev"]] == [2, 3]


def test_corrupt_event_file_is_detected(toy):
    assert main(["run", str(toy), "--quiet", "--set", "experiment.iterations=1"]) == 0
    (path,) = (toy.parent / "run/tensorboard").glob("events.out.tfevents.*")
    data = bytearray(path.read_bytes())
    assert len(read_records(path)) > 5
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="bad data CRC"):
        read_records(path)


def test_without_tensorboardx_it_does_nothing_and_says_so_once(toy, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX now raises ImportError
    assert tracker.writer_class()[0] is None
    assert main(["run", str(toy), "--quiet"]) == 0
    run = toy.parent / "run"
    assert not (run / "tensorboard").exists()
    state = json.loads((run / "tracking.json").read_text())
    assert state["tensorboard"] is False and "tensorboardX" in state["reason"]
    assert state["install"] == "pip install 'star-engine-tracking[tensorboard]'"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("tracking_disabled") == 1
    assert metrics(run)  # the run itself is untouched


def test_plugins_command_without_tensorboardx(tmp_path):
    blocker = tmp_path / "block" / "tensorboardX"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('tensorboardX blocked by the test')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    env.update(STAR_ENGINE_DISABLE_AUTOLOAD="1", STAR_ENGINE_PLUGINS=PLUGINS,
               PYTHONPATH=os.pathsep.join([str(blocker.parent), str(TESTS)]))
    res = subprocess.run([sys.executable, "-m", "star_engine", "plugins", "--json"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    (info,) = [p for p in json.loads(res.stdout) if p["name"] == "star_tracking.plugin"]
    assert info["error"] is None and info["hooks"] == ["on_iteration_end", "on_run_end", "on_run_start"]
    toml = tmp_path / "toy.toml"
    toml.write_text(TOY_TOML.format(out=(tmp_path / "run").as_posix()))
    res = subprocess.run([sys.executable, "-m", "star_engine", "run", str(toml)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("tracking_disabled") == 1 and "tensorboardX blocked by the test" in res.stderr
