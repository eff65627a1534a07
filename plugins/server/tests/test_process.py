"""``ServerProcess`` with a real child: the fake server run as a script (with a child of its own, so
the server is a process group of two). After ``stop``, an exception inside ``with``, a Ctrl-C in
the parent, a server that exits or never lists a model, no process of the group remains."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from star_engine import UserError
from star_server import CompletionRequest, CompletionsClient, ServerProcess, check_command
from star_server.process import group_alive, log_tail

FAKE = Path(__file__).with_name("fake_openai_server.py")


def command(*flags: str) -> str:
    return shlex.join([sys.executable, str(FAKE), "--port", "{port}", "--model", "{model}", *flags])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and waiting for its parent to reap it, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


def pids(pid_file: Path) -> list[int]:
    found = json.loads(pid_file.read_text())
    return [found["server"], found["child"]]


def gone(pid_list: list[int], within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pid_list) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(alive(p) for p in pid_list)


def server(tmp_path: Path, *flags: str, model: str = "models/iter_0001", **kw) -> ServerProcess:
    opts = {"timeout_seconds": 20.0, "grace_seconds": 2.0, **kw}
    return ServerProcess(command("--child", "--pid-file", str(tmp_path / "pids.json"), *flags), tmp_path / model,
                         tmp_path / "server.log", **opts)


def test_start_serve_and_stop_the_whole_group(tmp_path):
    s = server(tmp_path)
    with s:
        group = pids(tmp_path / "pids.json")
        assert group[0] == s.pid and all(alive(p) for p in group)
        assert s.models == [str(tmp_path / "models/iter_0001")] and s.url.startswith("http://127.0.0.1:")
        c = CompletionsClient(s.url, s.models[0], timeout_seconds=5.0, retries=0)
        assert c.complete([CompletionRequest("1+1=", 2, 3, 0.0, 1.0, 8)]) == [["1+1=#3#0", "1+1=#3#1"]]
    assert s.pid is None and gone(group) and not group_alive(group[0])
    assert "fake server starting" in (tmp_path / "server.log").read_text()
    s.stop()  # again: nothing to do


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    s = server(tmp_path, "--ignore-term", grace_seconds=0.5).start()
    group = pids(tmp_path / "pids.json")
    t = time.monotonic()
    s.stop()
    assert 0.4 < time.monotonic() - t < 3.5 and gone(group)


def test_an_exception_inside_with_stops_it(tmp_path):
    with pytest.raises(ValueError, match="stage failed"), server(tmp_path):
        group = pids(tmp_path / "pids.json")
        raise ValueError("stage failed")
    assert gone(group)


def test_keyboard_interrupt_inside_with_stops_it(tmp_path):
    with pytest.raises(KeyboardInterrupt), server(tmp_path):
        group = pids(tmp_path / "pids.json")
        raise KeyboardInterrupt
    assert gone(group)


DRIVER = textwrap.dedent("""
    import os, signal, sys, time
    from star_server import ServerProcess
    server = ServerProcess(sys.argv[1], sys.argv[2], sys.argv[3], timeout_seconds=20, grace_seconds=2)
    if sys.argv[4] == "with":
        with server:
            print("ready", flush=True)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            time.sleep(30)
    else:
        server.start()  # no with: the atexit hook stops it
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
""")


@pytest.mark.parametrize("mode", ["with", "atexit"])
def test_ctrl_c_in_the_parent_process_leaves_no_orphan(tmp_path, mode):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    pid_file = tmp_path / "pids.json"
    cmd = command("--child", "--pid-file", str(pid_file))
    res = subprocess.run([sys.executable, "-c", DRIVER, cmd, str(tmp_path / "m"), str(tmp_path / "log"), mode],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.stdout == "ready\n" and "KeyboardInterrupt" in res.stderr, res.stderr
    assert gone(pids(pid_file))


def test_restart_serves_another_model_and_stops_the_old_one(tmp_path):
    with server(tmp_path) as s:
        first, port = pids(tmp_path / "pids.json"), s.port
        s.restart(tmp_path / "models/iter_0002")
        assert gone(first) and s.models == [str(tmp_path / "models/iter_0002")]
        second = pids(tmp_path / "pids.json")
        assert second != first and all(alive(p) for p in second) and s.port is not None and port is not None
        assert CompletionsClient(s.url, s.models[0]).models() == s.models
    assert gone(second)


def test_a_server_that_exits_names_the_command_and_its_log(tmp_path):
    s = ServerProcess(command("--exit-code", "3"), tmp_path / "m", tmp_path / "server.log", timeout_seconds=20)
    with pytest.raises(UserError) as e:
        s.start()
    msg = str(e.value)
    assert "\n" not in msg and "exited with code 3" in msg and str(FAKE) in msg
    assert "fatal: cannot load" in msg and "out of memory" in msg and s.pid is None


def test_a_server_that_lists_no_model_times_out_and_is_stopped(tmp_path):
    s = server(tmp_path, "--no-models", timeout_seconds=1.0)
    t = time.monotonic()
    with pytest.raises(UserError, match=r"did not answer /health and list a model on /v1/models within 1 s; "
                                        r"its log .* ends: .*fake server starting"):
        s.start()
    assert time.monotonic() - t < 5 and s.pid is None and gone(pids(tmp_path / "pids.json"))


def test_a_command_that_cannot_run_is_one_line(tmp_path):
    with pytest.raises(UserError, match="did not start"):
        ServerProcess("/nonexistent/vllm serve {model} --port {port}", tmp_path, tmp_path / "log").start()


@pytest.mark.parametrize("cmd, match", [
    ("vllm serve --port {port}", r"no \{model\} placeholder"),
    ("vllm serve {model}", r"no \{port\} placeholder"),
    ("vllm serve '{model} --port {port}", "does not split"),
    ("  ", "empty"),
])
def test_bad_commands_are_refused(cmd, match):
    with pytest.raises(UserError, match=match):
        check_command(cmd)


def test_placeholders_are_filled_inside_words_and_braces_elsewhere_kept(tmp_path):
    s = ServerProcess("serve --model={model} --port {port} --override '{\"a\": 1}'", "/m", tmp_path / "log")
    assert s.argv(8001) == ["serve", "--model=/m", "--port", "8001", "--override", '{"a": 1}']


def test_the_log_tail_is_one_short_line(tmp_path):
    log = tmp_path / "log"
    log.write_text("".join(f"line {i}\n\n" for i in range(100)) + "x" * 1000 + "\n")
    tail = log_tail(log)
    assert "\n" not in tail and len(tail) == 403 and tail.endswith("xxx")
    log.write_text("a\nb\nc\n")
    assert log_tail(log) == "a | b | c" and log_tail(tmp_path / "none") == "(no log)"


def test_stop_before_start_does_nothing(tmp_path):
    s = ServerProcess(command(), tmp_path, tmp_path / "log")
    s.stop()
    assert "stopped" in repr(s)
    with pytest.raises(RuntimeError):
        s.url  # noqa: B018


def test_ctrl_c_while_waiting_for_the_server_stops_it(tmp_path, monkeypatch):
    pid_file = tmp_path / "pids.json"

    def interrupted(self, timeout):
        while not pid_file.exists():
            time.sleep(0.01)
        raise KeyboardInterrupt

    monkeypatch.setattr(ServerProcess, "probe", interrupted)
    s = server(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        s.start()
    assert s.pid is None and gone(pids(pid_file))
