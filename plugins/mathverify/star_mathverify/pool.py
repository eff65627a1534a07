"""The parent's side of the worker process (``star_mathverify.worker``): each request is bounded
in time, wherever the caller runs (any thread; no signals), and a request past its bound kills
the worker, which is started again for the next one.

The worker is a fresh interpreter (``python -c WORKER``: a spawn, so nothing of
the parent's JAX state is inherited, and unlike ``multiprocessing``'s spawn it does not import the
parent's ``__main__`` again, so a script without an ``if __name__ == "__main__"`` guard works),
talking over two pipes with ``multiprocessing.connection``. One worker per checker, started on the
first request (it imports math-verify: about a second); requests are served one at a time (a lock
orders callers on several threads). The worker is stopped when the checker is garbage collected
or the interpreter exits, and dies with its parent (Linux: ``PR_SET_PDEATHSIG``; elsewhere at its
next request, when the pipe is closed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any
from collections.abc import Mapping

from star_engine import UserError

START_SECONDS = 120.0  # a cold start imports sympy and math-verify; a busy machine takes longer
PACKAGE = "math-verify[antlr4_13_2]"
WORKER = "import sys; from star_mathverify.worker import main; main(sys.argv[1:])"


class TimedOut(Exception):
    """The request ran past its bound (or the worker died on it); the worker was stopped."""


def _stop(state: dict[str, Any]) -> None:
    for key in ("to_worker", "from_worker"):
        conn = state.pop(key, None)
        if conn is not None:
            conn.close()
    proc = state.pop("proc", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(10)


class Worker:
    """A math-verify worker process for the options ``options`` (``worker.Verifier``'s, and
    ``memory_mb``: its address-space cap in MiB, 0 = none)."""

    def __init__(self, options: Mapping[str, Any]):
        self.options = dict(options)
        self.starts = 0  # processes started so far (the first, and one after each timeout)
        self._state: dict[str, Any] = {}
        self._lock = threading.Lock()
        weakref.finalize(self, _stop, self._state)

    def _start(self) -> None:
        down_r, down_w = os.pipe()  # parent -> worker
        up_r, up_w = os.pipe()  # worker -> parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # what this process imports
        try:
            proc = subprocess.Popen([sys.executable, "-c", WORKER, str(down_r), str(up_w)],
                                    pass_fds=(down_r, up_w), env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(down_r)
            os.close(up_w)
        self._state.update(proc=proc, to_worker=Connection(down_w, readable=False),
                           from_worker=Connection(up_r, writable=False))
        self.starts += 1
        conn = self._state["from_worker"]
        try:
            self._state["to_worker"].send(self.options)
            message = conn.recv() if conn.poll(START_SECONDS) else ("late", None)
        except (EOFError, OSError):
            message = ("died", proc.poll())
        if message[0] == "ready":
            return
        _stop(self._state)
        if message[0] == "missing":
            raise UserError(f"math_verify needs the package '{PACKAGE}' (module '{message[1]}' is missing in "
                            f"the worker process): pip install '{PACKAGE}'")
        raise RuntimeError(f"the math-verify worker process did not start ({message[0]}, within "
                           f"{START_SECONDS:.0f} s)")

    def request(self, message: tuple, seconds: float) -> Any:
        """The worker's reply to ``message``; ``TimedOut`` when none came within ``seconds``."""
        with self._lock:
            if "proc" in self._state and self._state["proc"].poll() is not None:  # died between requests
                _stop(self._state)
            if "proc" not in self._state:
                self._start()
            try:
                self._state["to_worker"].send(message)
                if not self._state["from_worker"].poll(seconds):
                    raise TimedOut
                kind, value = self._state["from_worker"].recv()
            except (TimedOut, EOFError, OSError):  # past the bound, or the worker died on it
                _stop(self._state)
                raise TimedOut from None
            if kind == "error":
                raise RuntimeError(f"math-verify failed in its worker process: {value}")
            return value

    def close(self) -> None:
        """Stop the worker now (a later request starts a new one)."""
        with self._lock:
            _stop(self._state)
