"""The backend's start-up: the ``star-engine`` command runs itself again once with glibc's
huge-page tunable (same pid, same arguments) before the runtime starts, unless opted out or
already set; building the backend (what ``star-engine validate`` does) starts nothing."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from star_engine.helpers import RERUN_ENV
from star_haiku_xmap.session import machine

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc tunables")
def test_environment_gains_the_tunable_once():
    env = machine.hugepages_environ({"PATH": "/bin"}, accelerator=False)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": machine.HUGETLB, RERUN_ENV: "1"}  # the command says its notes once
    assert machine.hugepages_environ(env) is None  # the second run does not exec again
    kept = machine.hugepages_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, accelerator=False)
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + machine.HUGETLB
    assert machine.hugepages_environ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None  # the user's choice
    assert machine.hugepages_environ({machine.OPT_OUT: "0"}) is None


def test_an_accelerator_keeps_the_cpu_tuning_off(tmp_path):
    """On a machine with a GPU or TPU the backend never re-execs for huge pages (XLA:CPU's tuning)."""
    assert machine.hugepages_environ({"PATH": "/bin"}, accelerator=True) is None
    fake = tmp_path / "nvidiactl"
    assert not machine.accelerator_present((str(fake),))
    fake.write_text("")
    assert machine.accelerator_present((str(fake),))
    assert machine.accelerator_present() == any(os.path.exists(d) for d in machine.ACCELERATOR_DEVICES)


# The command's start-up as the run takes it (``Backend.start``), in a process that is the
# command (``sys.argv[0]`` the console script's name); the first line is printed before.
_CHILD = """
import os, sys
print("start", os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
sys.argv[0] = "star-engine"
from star_haiku_xmap.plugin import HaikuXmapBackend
b = HaikuXmapBackend.from_table(n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
                                mesh={"dp": 1, "mp": 1}, cpu_devices=1)
b.start()
print("after", os.getpid(), os.environ.get("GLIBC_TUNABLES"), sys.argv[1:], flush=True)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc tunables")
@pytest.mark.parametrize("opt_out", [False, True])
def test_the_command_runs_again_in_the_same_process(opt_out):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", machine.OPT_OUT)}
    env["STAR_HAIKU_XMAP_COMPILE_CACHE"] = "0"
    if opt_out:
        env[machine.OPT_OUT] = "0"
    out = subprocess.run([sys.executable, "-c", _CHILD, "x", "--y"], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    lines = [line.split(" ", 3) for line in out if line]
    pid = lines[0][1]
    if opt_out or machine.accelerator_present():
        assert lines == [["start", pid, "None", "['x', '--y']"], ["after", pid, "None", "['x', '--y']"]]
    else:
        assert lines == [["start", pid, "None", "['x', '--y']"], ["start", pid, machine.HUGETLB, "['x', '--y']"],
                         ["after", pid, machine.HUGETLB, "['x', '--y']"]]


def test_only_the_command_runs_itself_again(monkeypatch):
    """A test session, a notebook or a benchmark that starts a backend keeps its process."""
    monkeypatch.setattr(sys, "argv", ["/usr/bin/pytest"])
    assert not machine.is_command()
    monkeypatch.setattr(sys, "argv", ["/venv/bin/star-engine", "run", "x.toml"])
    assert machine.is_command()


_VALIDATE = """
import threading
from star_engine import GenSpec, TrainSpec
from star_haiku_xmap.plugin import HaikuXmapBackend
threads = threading.active_count()
b = HaikuXmapBackend.from_table(n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8, n_ctx=64,
                                distributed={"coordinator": "localhost:1", "num_processes": 2, "process_id": 1})
b.validate_run({"generation": GenSpec(16, 0.0, 1.0, (), 4)}, {"training": TrainSpec(0, 8, 1, 0, {})})
assert (b.process_count(), b.process_index()) == (2, 1)
from jax._src import distributed, xla_bridge
assert not xla_bridge.backends_are_initialized(), "jax's backends started"
assert distributed.global_state.client is None, "jax.distributed started"
assert threading.active_count() == threads, "a thread started"
print("nothing started")
"""


def test_building_and_validating_start_nothing():
    """``star-engine validate`` builds the backend and calls ``validate_run``: no jax backend,
    no ``jax.distributed``, no heartbeat thread (the layout is the configured one)."""
    out = subprocess.run([sys.executable, "-c", _VALIDATE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "nothing started", out.stderr


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
@pytest.mark.skipif(not GLIBC, reason="glibc tunables")
def test_a_run_that_runs_again_says_its_notes_once(tmp_path):
    """The run loads its configuration (and says its notes: here the settings an ablation by
    --set leaves unused), then runs itself again for the huge pages and loads it again: the
    second load says nothing the first said."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", machine.OPT_OUT, RERUN_ENV)}
    env["STAR_HAIKU_XMAP_COMPILE_CACHE"] = "0"
    root = Path(__file__).resolve().parents[3]
    res = subprocess.run([sys.executable, "-m", "star_engine", "run", str(root / "experiments" / "addition.toml"),
                          "--smoke", "--quiet", "--limit", "2", "--set", "rationalization.enabled=false",
                          "--set", f"experiment.output_dir={json.dumps(str(tmp_path / 'run'))}"],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    notes = [line for line in res.stderr.splitlines() if line.startswith("note: ")]
    assert notes and len(notes) == len(set(notes)), res.stderr  # each note once
