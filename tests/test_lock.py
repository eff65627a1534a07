"""One run per run directory: a second ``star-engine run`` of a directory a run holds is refused
at once (fcntl.flock on RUN_DIR/.lock, taken before the first write); ``report`` reads meanwhile;
a ``kill -9`` releases the lock, so the rerun resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pyarrow.parquet as pq

from star_testkit import cli, scripted_env
from star_engine.rundir import runlock
from star_engine.cli import main


def start(path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "star_engine", "run", str(path), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=scripted_env(**env))


def wait_for(path, proc, timeout=120.0) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout, f"{path} did not appear"
        time.sleep(0.01)


def test_second_run_is_refused_at_once_and_report_reads_meanwhile(toy_toml):
    path = toy_toml()
    run = path.parent / "run"
    first = start(path, SCRIPTED_SLEEP="0.03")  # a slow model: the run lasts several seconds
    try:
        wait_for(run / "iterations/000/metrics.parquet", first)
        events_before = (run / "events.jsonl").read_bytes()
        t0 = time.monotonic()
        second = cli("run", str(path), "--quiet")
        took = time.monotonic() - t0
        assert first.poll() is None, "the first run ended before the second started: the test proves nothing"
        assert second.returncode == 2, second.stderr
        assert second.stderr.startswith(f"error: {run}: another star-engine run is using this run directory (pid "
                                        f"{first.pid} on ") and second.stderr.count("\n") == 1, second.stderr
        assert took < 30  # at once: no waiting for the first run
        assert (run / "events.jsonl").read_bytes()[:len(events_before)] == events_before
        assert b'"fatal"' not in (run / "events.jsonl").read_bytes()  # nothing of the second run's in the log
        wait_for(run / "metrics.parquet", first)
        rep = cli("report", str(run))  # reading while the run holds the directory
        assert rep.returncode == 0, rep.stderr
        assert (run / "report.md").read_text().startswith("# STaR run: toy")
    finally:
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    names = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert names.count("start") == 1 and names.count("run_finished") == 1 and "resume" not in names
    assert pq.read_table(run / "metrics.parquet").num_rows > 0


def test_two_runs_started_together_one_runs_one_is_refused(toy_toml):
    path = toy_toml()
    procs = [start(path, SCRIPTED_SLEEP="0.03") for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [r[1][-2000:] for r in results]
    refused = next(err for p, (_, err) in zip(procs, results) if p.returncode == 2)
    assert "another star-engine run is using this run directory" in refused
    run = path.parent / "run"
    names = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert names.count("start") + names.count("resume") == 1  # the refused run wrote nothing


def test_kill_9_releases_the_lock_and_the_rerun_resumes(toy_toml):
    path = toy_toml()
    res = cli("run", str(path), "--quiet", env=scripted_env(SCRIPTED_KILL="generate:30"))
    assert res.returncode == -9
    run = path.parent / "run"
    assert (run / runlock.LOCK).exists()  # the file stays; the lock went with the process
    res = cli("run", str(path), "--quiet")
    assert res.returncode == 0, res.stderr
    names = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert names.count("resume") == 1 and names[-1] != "fatal"


def test_lock_is_taken_before_the_first_write_and_released_at_the_end(scripted, toy_toml, capsys):
    path = toy_toml()
    run = path.parent / "run"
    runlock.lock(run)  # as another run would hold it (a second open of the file: flock refuses it)
    try:
        assert main(["run", str(path), "--quiet"]) == 2
        assert "another star-engine run is using this run directory" in capsys.readouterr().err
        assert sorted(p.name for p in run.iterdir()) == [runlock.LOCK]  # nothing written
    finally:
        runlock.release_locks()
    assert main(["run", str(path), "--quiet"]) == 0  # the lock was this process's and is free again
    assert main(["run", str(path), "--quiet"]) == 0  # and released by the run that just ended


def test_a_config_written_while_the_folder_is_looked_at_makes_it_a_run_directory(scripted, toy_toml, monkeypatch):
    """The race two runs started together can meet without the lock (``validate``, a run's
    preflight): config.json was not there when looked for, and the folder holds more than a
    killed start's files when listed because the other run wrote them meanwhile. It is the other
    run's directory (a resume of it, the same configuration), not a foreign folder."""
    from star_engine.rundir import layout as rundir
    from star_engine.cli import main

    path = toy_toml()
    assert main(["run", str(path), "--quiet", "--set", "experiment.iterations=1"]) == 0
    run = path.parent / "run"
    config = (run / "config.json").read_bytes()
    (run / "config.json").unlink()
    real = rundir._names

    def names(root):
        (root / "config.json").write_bytes(config)  # the other run writes it now
        return real(root)

    monkeypatch.setattr(rundir, "_names", names)
    assert main(["validate", str(path), "--set", "experiment.iterations=1"]) == 0
