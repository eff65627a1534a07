"""An inference server the engine starts, waits for and stops (``[generation.server] command``).

``ServerProcess(command, model, log_path)`` runs ``command`` (a command line with ``{model}`` and
``{port}`` placeholders, e.g. ``vllm serve {model} --port {port}``) without a shell: the line is
split as a POSIX shell would split it (``shlex.split``) and each placeholder replaced inside the
words, so a JSON argument's braces stay as they are. ``{port}`` is a free local port picked at
each start, ``{model}`` the model folder to serve. The server runs in a session and process group
of its own (a terminal's Ctrl-C reaches the engine, not the server: the engine stops it, with
every process it started), its stdout and stderr appended to ``log_path``.

``start`` returns when ``GET /health`` answers 200 and ``GET /v1/models`` lists a model, polling
with a short backoff. If the process exits first, or ``timeout_seconds`` pass, the server is
stopped and ``start`` raises one ``UserError`` line naming the command and the last lines of its
log. ``stop`` sends SIGTERM to the process group, waits ``grace_seconds`` for every process of the
group to end, then sends SIGKILL, and reaps the server. A ``with`` block stops it on the way out
(an exception or Ctrl-C included); an ``atexit`` hook stops every server still running when the
interpreter exits. A SIGKILL of the engine itself cannot be caught: the server then outlives it.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType

from star_engine import UserError

__all__ = ["ServerProcess", "check_command", "free_port", "group_alive", "group_members", "log_tail"]

PLACEHOLDERS = ("{model}", "{port}")
LOG_TAIL_LINES = 5
LOG_TAIL_CHARS = 400


def check_command(command: str) -> list[str]:
    """``command``'s words (``shlex.split``), or a ``UserError`` when it does not split or lacks a
    placeholder: the engine cannot point the server at the model or the port without them."""
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise UserError(f"server command {command!r} does not split into words: {e}") from None
    if not words:
        raise UserError("server command is empty: give a command line with {model} and {port}")
    for p in PLACEHOLDERS:
        if not any(p in w for w in words):
            raise UserError(f"server command {command!r} has no {p} placeholder "
                            "(the engine fills in the model folder and a free port)")
    return words


def free_port(host: str = "127.0.0.1") -> int:
    """A local TCP port free at the moment of the call (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[list[str]]:
    """The ``/proc/<pid>/stat`` fields after ``"pid (comm) "`` (state, ppid, pgrp, ...) of every
    process in group ``pgid``, zombies included; ``[]`` where there is no ``/proc``."""
    proc, out = Path("/proc"), list[list[str]]()
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid):
            out.append(fields)
    return out


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a running member (a zombie waiting for its
    parent to reap it is not running: on Linux ``/proc`` tells them apart)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not Path("/proc").is_dir():
        return True
    return any(fields[0] not in ("Z", "X") for fields in group_members(pgid))


def log_tail(path: Path) -> str:
    """The last lines of a log, on one line (`` | `` between them), at most ``LOG_TAIL_CHARS``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-LOG_TAIL_LINES:])
    return (tail if len(tail) <= LOG_TAIL_CHARS else "..." + tail[-LOG_TAIL_CHARS:]) or "(empty log)"


_RUNNING: set[ServerProcess] = set()  # started and not yet stopped (the atexit hook's list)
_RUNNING_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    """Stop every server still running as the interpreter exits (a Ctrl-C outside a ``with``)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for server in running:
        server.stop()


class ServerProcess:
    """One server process: ``start``, ``stop``, ``restart(model)``; ``url`` while it runs."""

    def __init__(self, command: str, model: str | os.PathLike[str], log_path: str | os.PathLike[str], *,
                 timeout_seconds: float = 600.0, grace_seconds: float = 10.0, host: str = "127.0.0.1",
                 env: dict[str, str] | None = None):
        self.words = check_command(command)
        self.command = command
        self.model = str(model)
        self.log_path = Path(log_path)
        self.timeout_seconds = timeout_seconds
        self.grace_seconds = grace_seconds
        self.host = host
        self.env = env
        self.port: int | None = None
        self.models: list[str] = []  # what /v1/models listed when the server became ready
        self.proc: subprocess.Popen[bytes] | None = None

    # -- the process -------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        if self.port is None or self.proc is None:
            raise RuntimeError("the server is not running (call start)")
        return f"http://{self.host}:{self.port}"

    def argv(self, port: int) -> list[str]:
        return [w.replace("{model}", self.model).replace("{port}", str(port)) for w in self.words]

    def start(self) -> ServerProcess:
        """Start the server and wait until it answers; on failure it is stopped and one
        ``UserError`` line names the command and the end of its log."""
        if self.proc is not None:
            raise RuntimeError("the server is already running (stop it first, or restart)")
        self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = None if self.env is None else {**os.environ, **self.env}
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(self.argv(self.port))}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv(self.port), stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True, env=env)
            except OSError as e:
                self.port = None
                raise UserError(f"server command {self.command!r} did not start: {e}") from None
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        """Poll ``/health`` then ``/v1/models`` until both answer (a model listed), the process
        exits, or ``timeout_seconds`` pass."""
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout_seconds
        delay = 0.05
        while True:
            code = self.proc.poll()
            if code is not None:
                raise UserError(f"server command {self.command!r} exited with code {code} before it answered "
                                f"/health and /v1/models; its log {self.log_path} ends: {log_tail(self.log_path)}")
            models = self.probe(min(2.0, max(0.1, deadline - time.monotonic())))
            if models:
                self.models = models
                return
            if time.monotonic() >= deadline:
                raise UserError(f"server command {self.command!r} did not answer /health and list a model on "
                                f"/v1/models within {self.timeout_seconds:g} s; its log {self.log_path} ends: "
                                f"{log_tail(self.log_path)}")
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 1.0)

    def probe(self, timeout: float) -> list[str]:
        """The models the server lists once ``/health`` answers 200; ``[]`` while it does not."""
        assert self.port is not None
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            health = conn.getresponse()
            health.read()
            if health.status != 200:
                return []
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                return []
            data = json.loads(body).get("data")
            return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            return []
        finally:
            conn.close()

    def stop(self) -> None:
        """SIGTERM to the process group, ``grace_seconds`` for all of it to end, then SIGKILL;
        the server is reaped. Calling it again, or on a server never started, does nothing."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the server leads its own group
        deadline = time.monotonic() + self.grace_seconds
        self.signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        while group_alive(pgid) and time.monotonic() < deadline:  # the server's own children
            time.sleep(0.02)
        if proc.poll() is None or group_alive(pgid):
            self.signal_group(pgid, signal.SIGKILL)
        proc.wait()
        kill_deadline = time.monotonic() + 2.0
        while group_alive(pgid) and time.monotonic() < kill_deadline:
            time.sleep(0.02)
        self.proc = None
        self.port = None
        with _RUNNING_LOCK:
            _RUNNING.discard(self)

    @staticmethod
    def signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def restart(self, model: str | os.PathLike[str]) -> ServerProcess:
        """Stop the server and start it again serving ``model`` (on a new port: read ``url``)."""
        self.stop()
        self.model = str(model)
        self.models = []
        return self.start()

    def __enter__(self) -> ServerProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid} at {self.url}" if self.proc is not None else "stopped"
        return f"ServerProcess({self.command!r}, model={self.model!r}, {state})"
