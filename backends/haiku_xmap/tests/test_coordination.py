"""A multi-process run whose process fails or dies: the others stop with a clear error within a
bounded time instead of waiting at a barrier forever (``coordination.py``). Two real processes
on CPU (``jax.distributed`` on 127.0.0.1), as ``test_multihost.py`` starts them."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

WORKER = textwrap.dedent("""
    import sys, time
    pid, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    from star_engine.rundir import procs
    from star_engine.boundary import run_command
    from star_engine.errors import UserError
    from star_haiku_xmap import coordination
    from star_haiku_xmap.plugin import HaikuXmapBackend

    if mode == "busy-heartbeat":  # the heartbeat thread is inside the client's call nearly all the time
        coordination.HEARTBEAT_S = 0.0
    # A small model, never initialised: only the backend's multi-process methods are used.
    backend = HaikuXmapBackend.from_table(n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=128, rotary_dim=8,
                                          n_ctx=64, distributed={"coordinator": f"127.0.0.1:{port}",
                                                                 "num_processes": 2, "process_id": pid})
    backend.start()  # jax.distributed (gloo collectives on CPU) and the heartbeat

    def work():
        p = procs.configure(backend)
        with p.stopping_others_on_failure():
            return steps(p)

    def steps(p):
        for i in range(20):
            p.sync(f"step {i}")
        print("READY", flush=True)
        if pid == 1 and mode == "fail":
            time.sleep(1)
            raise UserError("data.jsonl:3: a bad row")
        if mode.startswith("hang") and pid == int(mode.split("-")[-1]):
            time.sleep(3600)  # killed by the test
        p.sync("after")
        return 0

    sys.exit(run_command(work))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(mode: str, **env: str) -> list[subprocess.Popen]:
    port = _free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("STAR_ENGINE_", "JAX_COORDINATOR"))}
    full.update({"JAX_PLATFORMS": "cpu", **env})
    return [subprocess.Popen([sys.executable, "-c", WORKER, str(pid), str(port), mode], env=full, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for pid in (0, 1)]


def wait_ready(ps: list[subprocess.Popen]) -> None:
    for p in ps:
        line = p.stdout.readline()
        assert line.strip() == "READY", (line, p.stderr.read()[-3000:] if p.poll() is not None else "")


def finish(p: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"still waiting after {timeout} s: {p.communicate()[1][-3000:]}") from None
    return p.returncode, err, time.monotonic() - t0


def test_a_failing_process_stops_the_other_at_once():
    ps = start("fail")
    wait_ready(ps)
    rc1, err1, _ = finish(ps[1], 60)
    rc0, err0, took = finish(ps[0], 60)
    assert rc1 == 2 and err1.strip().endswith("error: data.jsonl:3: a bad row"), err1[-2000:]
    assert rc0 == 3, err0[-3000:]
    lines = [x for x in err0.splitlines() if x.startswith("error: ")]
    assert lines == ["error: process 0 of 2, barrier 21 ('star-engine 21: after'): another process failed: process 1: "
                     "data.jsonl:3: a bad row; this process stops too (rerun every process to resume)"], err0[-3000:]
    assert took < 20


def test_processes_exit_cleanly_while_their_heartbeat_is_inside_the_client():
    """The heartbeat thread is stopped before JAX shuts the coordination client down at
    exit: a daemon thread left inside the client's C++ call when the interpreter finalises
    aborts the process ("FATAL: exception not rethrown", exit code -6), as it did in CI."""
    ps = start("busy-heartbeat")
    wait_ready(ps)
    for p in ps:
        rc, err, _ = finish(p, 60)
        assert rc == 0 and "not rethrown" not in err, err[-3000:]


def test_a_killed_process_stops_the_other_within_the_peer_timeout():
    ps = start("hang-1", STAR_HAIKU_XMAP_PEER_TIMEOUT="5")
    wait_ready(ps)
    time.sleep(1)
    ps[1].send_signal(signal.SIGKILL)
    rc0, err0, took = finish(ps[0], 90)
    assert rc0 == 3, err0[-3000:]
    assert "error: process 0 of 2, barrier 21 ('star-engine 21: after'): process 1 sent no heartbeat for 5 s: it " \
           "died or hangs; this process stops too" in err0, err0[-3000:]
    assert took < 30  # 5 s without a heartbeat, then at once (the runtime's shutdown is not waited for)
    ps[1].wait()


def test_a_killed_coordinator_stops_the_other_at_once():
    """Process 0 runs JAX's coordination service: when it dies, the other's next request fails.
    Either this module says so, or JAX terminates the process itself with its own message
    (whichever notices first); both name the cause, within seconds."""
    ps = start("hang-0", STAR_HAIKU_XMAP_PEER_TIMEOUT="5")
    wait_ready(ps)
    time.sleep(1)
    ps[0].send_signal(signal.SIGKILL)
    rc1, err1, took = finish(ps[1], 90)
    assert rc1 != 0 and took < 30, (rc1, took, err1[-3000:])
    ours = "lost the coordination service" in err1 or "sent no heartbeat" in err1
    jaxs = "Terminating process because the JAX distributed service detected fatal errors" in err1
    assert ours or jaxs, err1[-3000:]
    ps[0].wait()


def _multihost():
    """test_multihost.py, for its experiment and its process helpers (a sibling test file)."""
    spec = importlib.util.spec_from_file_location("_test_multihost", Path(__file__).with_name("test_multihost.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_star_engine_run_stops_when_one_of_its_processes_is_killed(tmp_path):
    """`star-engine run` on 2 processes x 1 device; process 1 is killed once the run directory holds
    the first iteration's files: process 0 stops within a bound (wherever it was: a barrier, a
    collective) with an error naming the cause, and the run resumes on a rerun."""
    multihost = _multihost()
    cfg = tmp_path / "exp.toml"
    cfg.write_text(multihost.RUN_TOML.format(out=tmp_path / "run").replace("mp = 4", "mp = 1"))
    env = multihost._env(1, {"STAR_ENGINE_BLOCK_PLUGINS": "tracking", "STAR_HAIKU_XMAP_PEER_TIMEOUT": "10",
                             "STAR_ENGINE_COORDINATOR": f"127.0.0.1:{_free_port()}",
                             "STAR_ENGINE_NUM_PROCESSES": "2"})
    ps = [subprocess.Popen([sys.executable, "-m", "star_engine", "run", str(cfg), "--quiet"],
                           env={**env, "STAR_ENGINE_PROCESS_ID": str(pid)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for pid in (0, 1)]
    marker = tmp_path / "run" / "iterations" / "001" / "generated.parquet"
    t0 = time.monotonic()
    while not marker.exists():
        assert all(p.poll() is None for p in ps), [p.communicate()[1][-2000:] for p in ps]
        assert time.monotonic() - t0 < 600
        time.sleep(0.05)
    ps[1].send_signal(signal.SIGKILL)
    rc0, err0, took = finish(ps[0], 200)
    ps[1].wait()
    assert rc0 != 0 and took < 150, (rc0, took, err0[-3000:])
    causes = ("sent no heartbeat", "Connection closed by peer", "another task died", "lost the coordination service",
              "Connection reset by peer")
    assert any(c in err0 for c in causes), err0[-3000:]
    if rc0 in (2, 3):  # stopped by star-engine (not terminated by JAX): the run directory says why
        last = json.loads((tmp_path / "run" / "events.jsonl").read_text().splitlines()[-1])
        assert last["event"] == "fatal", last
