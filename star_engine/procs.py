"""One run directory, several processes.

A backend spread over hosts (multi-process JAX, for example) runs the same
program in every process: each one executes the whole STaR loop in step, because
each train and generate call is a collective. The run directory (on a
filesystem every host sees) must still be written once. So process 0 alone
changes files, and every change (a write, a removal) ends at a barrier that all
processes reach in the same order; after it the others read what process 0
wrote. Every decision the loop takes comes from files read after a barrier or
from values all processes compute alike, so the processes never diverge.

A backend opts in with three optional methods: ``process_index() -> int``,
``process_count() -> int`` and ``barrier(name: str) -> None`` (all processes
call it with the same name; it returns when every one has). With one process
(every backend without them) nothing here does anything.

A fourth, ``abort(message: str) -> None``, is optional too: a process that fails
calls it (``star_engine.boundary``) so that the others, waiting at a barrier or
arriving at the next, stop at once with ``ProcessLost`` naming it, instead of
waiting for it. The backend's barrier must also end (``ProcessLost``) within a
bounded time when a process dies without a word (killed, its machine lost).

The run directory's lock (``star_engine.rundir``) is process 0's: it takes it
before the first barrier and holds it for all; the other processes do not lock.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

from .api import MultiProcess


@dataclass
class Processes:
    index: int = 0
    count: int = 1
    barrier: Callable[[str], None] | None = None
    abort: Callable[[str], None] | None = None
    _synced: int = 0
    _alone: int = 0  # > 0 inside ``alone()``

    @property
    def primary(self) -> bool:
        """True in the process that writes the run directory (process 0)."""
        return self.index == 0

    def sync(self, what: str) -> None:
        """Wait until every process is here. Called after each change to the run
        directory; the numbered name makes a process that took another path fail
        at the barrier (when the backend checks names) instead of reading stale files."""
        if self.count > 1 and not self._alone:
            self._synced += 1
            self.barrier(f"star-engine {self._synced}: {what}")


CURRENT = Processes()


def configure(backend: Any) -> Processes:
    """Take the process layout from ``backend``: an ``api.MultiProcess`` (see the module
    docstring), or one process."""
    global CURRENT
    if isinstance(backend, MultiProcess):
        count, index, barrier = int(backend.process_count()), int(backend.process_index()), backend.barrier
    else:
        count, index, barrier = int(getattr(backend, "process_count", lambda: 1)()), 0, None
        if count > 1:
            raise TypeError(f"{type(backend).__name__}: {count} processes but not every method of "
                            "star_engine.api.MultiProcess (process_index, process_count, barrier)")
    if not 0 <= index < max(count, 1):
        raise ValueError(f"{type(backend).__name__}: process_index {index} outside [0, {count})")
    CURRENT = Processes(index=index, count=count, barrier=barrier, abort=getattr(backend, "abort", None))
    return CURRENT


def abort(message: str) -> None:
    """Tell the other processes that this one is stopping (best effort: it is already failing)."""
    if CURRENT.count > 1 and CURRENT.abort is not None:
        try:
            CURRENT.abort(message)
        except Exception:  # noqa: BLE001 -- the runtime may already be gone; the error being reported matters
            pass


@contextlib.contextmanager
def alone():
    """Code that only process 0 runs (observer hooks): its writes wait for no one."""
    CURRENT._alone += 1
    try:
        yield
    finally:
        CURRENT._alone -= 1


def primary_does(what: str, action: Callable[[], Any]) -> Any:
    """Run ``action`` (a change to the run directory) in process 0 only, then wait for
    all. Returns what ``action`` returned (None in the other processes)."""
    try:
        return action() if CURRENT.primary else None
    finally:  # process 0 failing still releases the others (who then fail on what is missing)
        CURRENT.sync(what)
