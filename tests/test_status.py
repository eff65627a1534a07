"""``star-engine status RUN_DIR`` and ``validate`` on an existing run directory, on runs of the toy
experiment made here (the scripted backend, in subprocesses: killed where a stage runs, or still
running): finished, stopped at the stage that was running, running with the pid of the process
that holds the lock; the time spent (events.jsonl) and left (metrics.parquet)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from star_engine.rundir import runlock
from star_engine.cli import main
from star_engine.report.status import clock, sessions, status
from star_testkit import TOY_TOML, cli, scripted_env

# SCRIPTED_KILL points and the stage each stops in: the toy run evaluates 12 dev questions at
# iteration 0, then generates for 24 train questions; its training runs 3 steps an iteration.
KILLS = {"generate:5": (0, "evaluate"), "generate:20": (1, "generate"), "train_step:5": (2, "train")}


def _toml(base: Path, name: str) -> Path:
    path = base / f"{name}.toml"
    path.write_text(TOY_TOML.format(out=(base / name).as_posix()))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A finished run and one killed at each of ``KILLS``: name -> experiment file."""
    base = tmp_path_factory.mktemp("status")
    out = {"finished": _toml(base, "finished")}
    res = cli("run", str(out["finished"]), "--quiet")
    assert res.returncode == 0, res.stderr
    for i, kill in enumerate(KILLS):
        out[kill] = _toml(base, f"killed{i}")
        res = cli("run", str(out[kill]), "--quiet", env=scripted_env(SCRIPTED_KILL=kill))
        assert res.returncode == -9, res.stderr  # SIGKILL
    return out


def run_dir(toml: Path) -> Path:
    return toml.with_suffix("")


def stamps(root: Path) -> list[float]:
    return [datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
            for line in (root / "events.jsonl").read_text().splitlines()]


def test_a_finished_run_says_so_with_the_time_its_events_span(runs, capsys):
    root = run_dir(runs["finished"])
    assert main(["status", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    t = stamps(root)
    assert out[0] == f"{root}: finished (iteration 3 of 3)"
    assert out[1].startswith(f"time spent: {clock(t[-1] - t[0])} (events.jsonl: 1 start,")
    assert len(out) == 2  # nothing left to estimate
    st = status(root)
    assert st.state == "finished" and st.spent == pytest.approx(t[-1] - t[0]) and st.left is None


@pytest.mark.parametrize("kill", KILLS)
def test_a_killed_run_is_stopped_at_the_stage_that_was_running(runs, kill, capsys):
    root = run_dir(runs[kill])
    n, stage = KILLS[kill]
    assert main(["status", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{root}: stopped at stage {stage} of iteration {n} of 3; run again to resume"
    st = status(root)
    assert st.state == "stopped" and st.at == (n, stage) and st.holder is None
    if n < 2:  # no iteration done to measure by
        assert st.left is None and out[2] == "time left: unknown (no iteration is done yet to measure one by)"
    else:  # iteration 1's wall time, times the 2 iterations still to run
        wall = {r["iteration"]: r["wall_seconds"] for r in pq.read_table(root / "metrics.parquet").to_pylist()}
        assert st.left == pytest.approx(2 * wall[1])
        assert out[2].startswith(f"time left: about {clock(2 * wall[1])} ({clock(wall[1])} per iteration, the mean "
                                 f"of the 1 iteration done (metrics.parquet wall_seconds), x 2 to go")


def test_validate_says_what_running_again_does(runs, capsys):
    assert main(["validate", str(runs["finished"])]) == 0
    assert f"run directory {run_dir(runs['finished'])}: finished (iteration 3 of 3); run again does nothing)" \
        in capsys.readouterr().out
    assert main(["validate", str(runs["finished"]), "--set", "experiment.iterations=5"]) == 0
    assert "finished (iteration 3 of 3); experiment.iterations is now 5: run continues it)" in capsys.readouterr().out
    assert main(["validate", str(runs["train_step:5"])]) == 0
    assert "stopped at stage train of iteration 2 of 3: run resumes it there)" in capsys.readouterr().out


@pytest.fixture(autouse=True)
def _scripted(scripted):
    """``validate`` in this process loads the scripted plugin only."""


def test_a_running_run_names_the_process_that_holds_it(tmp_path):
    toml = _toml(tmp_path, "live")
    proc = subprocess.Popen([sys.executable, "-m", "star_engine", "run", str(toml), "--quiet"],
                            env=scripted_env(SCRIPTED_SLEEP="0.05"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir(toml) / "config.json").exists() or runlock.holder(run_dir(toml)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it was seen running"
            time.sleep(0.05)
        res = cli("status", str(run_dir(toml)))
        first = res.stdout.splitlines()[0]
        assert res.returncode == 0 and first.startswith(f"{run_dir(toml)}: running (pid {proc.pid} on "), res.stdout
        assert " of iteration 0 of 3" in first or " of iteration 1 of 3" in first
        assert "the current one to now" in res.stdout.splitlines()[1]
    finally:
        proc.kill()
        proc.wait()
    assert status(run_dir(toml)).state == "stopped"  # the lock went with the process


def test_the_lock_holder_is_seen_and_gone_when_released(tmp_path):
    assert runlock.holder(tmp_path) is None  # no lock file
    runlock.lock(tmp_path)
    try:
        assert runlock.holder(tmp_path).startswith(f"pid {os.getpid()} on ")
    finally:
        runlock.release_locks()
    assert runlock.holder(tmp_path) is None


def test_the_time_spent_sums_each_start_to_its_last_event():
    def ev(name: str, t: float) -> dict:
        return {"event": name, "timestamp": datetime.fromtimestamp(1e9 + t).astimezone().isoformat()}

    events = [ev("start", 0), ev("iteration_done", 10), ev("fatal", 12), ev("resume", 100), ev("iteration_done", 130)]
    runs = sessions(events)
    assert [(b - 1e9, e - 1e9, len(evs)) for b, e, evs in runs] == [(0, 12, 3), (100, 130, 2)]


@pytest.mark.parametrize("what", ["missing", "file", "folder"])
def test_status_and_show_of_what_is_no_run_directory_is_one_line_and_exit_2(tmp_path, what, capsys):
    target = tmp_path / "x"
    if what == "file":
        target.write_text("")
    elif what == "folder":
        target.mkdir()
        (target / "notes.txt").write_text("")
    for command in ("status", "show"):
        assert main([command, str(target)]) == 2
        res = capsys.readouterr()
        assert res.out == "" and res.err.count("\n") == 1 and res.err.startswith(f"error: {target}: "), res
        assert ("no such run directory" if what == "missing" else "not a star-engine run directory") in res.err
