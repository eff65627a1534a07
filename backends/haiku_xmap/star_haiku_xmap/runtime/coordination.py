"""Barriers that end: the processes of a multi-process run meet through the key-value
store of JAX's coordination service (``jax.distributed``), so that one process failing
or dying ends the others' waits with a clear ``ProcessLost`` instead of a hang.

- ``barrier(name)``: each process writes ``arrive/<n>/<process>`` = ``name`` and polls
  (1 ms, doubling to 100 ms) until every process has arrived at barrier ``n``. The wait
  ends with ``ProcessLost``

  * at once when another process called ``abort`` (it failed: the boundary of the
    command does that, ``star_engine.boundary``), naming it and its error;
  * at once when the coordination service is gone (process 0, which runs it, died);
  * when another process's heartbeat (below) is older than ``peer_timeout()`` seconds
    (it died without a word: ``kill -9``, its machine lost);
  * after ``barrier_timeout()`` seconds in any case (a process that hangs, or took
    another path).

  Every process must pass the same names in the same order; a process that arrives
  under another name is a bug (the processes diverged) and raises RuntimeError naming both.
- ``abort(message)``: tell the others that this process is stopping.
- ``start_heartbeat()``: a daemon thread that writes ``alive/<process>`` every
  ``HEARTBEAT_S`` seconds (started by the backend once ``jax.distributed`` is up, and by
  the first barrier at the latest). It is stopped and joined at exit, before JAX's own
  exit handler shuts the coordination client down: a daemon thread still inside the
  client's C++ call when the interpreter finalises is killed there by a forced unwind
  that the binding catches, and the process aborts ("FATAL: exception not rethrown").

JAX has its own heartbeat (``jax.distributed.initialize(heartbeat_timeout_seconds=...)``,
100 s by default): when it notices a dead process it terminates the others itself
("Terminating process because the JAX distributed service detected fatal errors"),
which also bounds a wait inside a collective (a train or decode step) that this module
cannot see. Environment: ``STAR_HAIKU_XMAP_BARRIER_TIMEOUT`` (seconds, default 3600) and
``STAR_HAIKU_XMAP_PEER_TIMEOUT`` (seconds, default 60).
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
from typing import Any

import jax
from jax._src import distributed

from star_engine import ProcessLost

from .envvars import BARRIER_TIMEOUT, PEER_TIMEOUT, env_seconds

PREFIX = "star-engine"
HEARTBEAT_S = 2.0
_counter = itertools.count(1)
_heartbeat: list[threading.Thread] = []
_stop = threading.Event()


def barrier_timeout() -> float:
    return env_seconds(*BARRIER_TIMEOUT)


def peer_timeout() -> float:
    return env_seconds(*PEER_TIMEOUT)


def _client() -> Any:
    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialised, but there are several processes")
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def start_heartbeat() -> None:
    """Write this process's heartbeat every ``HEARTBEAT_S`` seconds from a daemon thread
    (idempotent; nothing with one process)."""
    if _heartbeat or jax.process_count() == 1:
        return
    client, me = _client(), jax.process_index()

    def beat() -> None:
        for n in itertools.count():
            try:
                client.key_value_set(f"{PREFIX}/alive/{me}", str(n), allow_overwrite=True)
            except Exception:  # noqa: BLE001 -- the service is gone: the barriers report it
                return
            if _stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="star-engine heartbeat", daemon=True)
    thread.start()
    _heartbeat.append(thread)
    # registered after jax's own handler (jax is imported above), so it runs before it: LIFO
    atexit.register(stop_heartbeat)


def stop_heartbeat(timeout_s: float = 5 * HEARTBEAT_S) -> None:
    """Stop the heartbeat thread and wait (at most ``timeout_s``) for it to leave the
    client's call it may be in; called at exit (see the module docstring)."""
    _stop.set()
    for thread in _heartbeat:
        thread.join(timeout_s)


def abort(message: str) -> None:
    """Tell the other processes that this one stops (best effort), with ``message``."""
    if jax.process_count() > 1:
        try:
            _client().key_value_set(f"{PREFIX}/abort", message, allow_overwrite=True)
        except Exception:  # noqa: BLE001 -- the service may be gone already
            pass


class _Peers:
    """When each other process's heartbeat was last seen to change (this process's clock)."""

    def __init__(self, count: int, me: int):
        start = time.monotonic()
        self.seen: dict[int, tuple[str | None, float]] = {p: (None, start) for p in range(count) if p != me}

    def stale(self, beats: dict[int, str], now: float, limit: float) -> list[int]:
        out = []
        for p, (value, since) in self.seen.items():
            if beats.get(p) != value:
                self.seen[p] = (beats.get(p), now)
            elif now - since > limit:
                out.append(p)
        return out


def barrier(name: str, timeout_s: float | None = None) -> None:
    """Wait until every process has called ``barrier`` with ``name`` (see the module docstring)."""
    count = jax.process_count()
    if count == 1:
        return
    start_heartbeat()
    client, me, n = _client(), jax.process_index(), next(_counter)
    where = f"barrier {n} ({name!r})"

    def lost(what: str, exit_now: bool = True) -> ProcessLost:
        return ProcessLost(f"process {me} of {count}, {where}: {what}; this process stops too (rerun every process "
                           f"to resume)", exit_now=exit_now)

    try:
        client.key_value_set(f"{PREFIX}/arrive/{n}/{me}", name)
    except Exception as exc:  # noqa: BLE001
        raise lost(f"lost the coordination service ({_first_line(exc)}): process 0 died or is unreachable") from None
    timeout = barrier_timeout() if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout
    peers, delay, limit = _Peers(count, me), 0.001, peer_timeout()
    while True:
        try:
            arrived = dict(client.key_value_dir_get(f"{PREFIX}/arrive/{n}/"))
            if len(arrived) < count:
                message = _try_get(client, f"{PREFIX}/abort")
                beats = {int(k.rsplit("/", 1)[1]): v for k, v in client.key_value_dir_get(f"{PREFIX}/alive/")}
        except Exception as exc:  # noqa: BLE001
            raise lost(f"lost the coordination service ({_first_line(exc)}): process 0 died or is unreachable"
                       ) from None
        if len(arrived) >= count:
            break
        if message is not None:
            raise lost(f"another process failed: {message}", exit_now=False)
        now = time.monotonic()
        gone = peers.stale(beats, now, limit)
        if gone:
            raise lost(f"process {', '.join(map(str, gone))} sent no heartbeat for {limit:g} s: it died or hangs")
        if now > deadline:
            missing = sorted(set(range(count)) - {int(k.rsplit('/', 1)[1]) for k in arrived})
            raise lost(f"process {', '.join(map(str, missing))} did not arrive within {timeout:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    names = {k.rsplit("/", 1)[1]: v for k, v in arrived.items()}
    if len(set(names.values())) > 1:
        raise RuntimeError(f"{where}: the processes diverged: {names}")
    if n > 1:  # every process has passed barrier n - 1: its record is no longer read
        try:
            client.key_value_delete(f"{PREFIX}/arrive/{n - 1}/{me}")
        except Exception:  # noqa: BLE001 -- only housekeeping
            pass


def _try_get(client: Any, key: str) -> str | None:
    try:
        return client.key_value_try_get(key)
    except Exception as exc:  # noqa: BLE001 -- NOT_FOUND is the usual answer
        if "NOT_FOUND" in str(exc) or "not found" in str(exc).lower():
            return None
        raise
