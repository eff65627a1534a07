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
calls it (``Processes.stopping_others_on_failure``, around a run) so that the others, waiting at a barrier or
arriving at the next, stop at once with ``ProcessLost`` naming it, instead of
waiting for it. The backend's barrier must also end (``ProcessLost``) within a
bounded time when a process dies without a word (killed, its machine lost).

The run directory's lock (``star_engine.rundir.layout``) is process 0's: it takes it
before the first barrier and holds it for all; the other processes do not lock.

The layout is a value, never a global: ``configure`` returns a ``Processes`` that
the experiment holds (``Experiment.processes``) and passes to what writes the run
directory (the ``RunStore``, the runner). Code without one (reports, exports,
observer plugins, which only process 0 calls) writes plainly.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterator

from ..api import MultiProcess
from ..capabilities import Aborts
from ..failures import failure_message
from ..errors import ProcessLost
from ..config.registry import Component, calling


@dataclass
class Processes:
    index: int = 0
    count: int = 1
    barrier: Callable[[str], None] | None = None
    abort: Callable[[str], None] | None = None
    _synced: int = 0

    @property
    def primary(self) -> bool:
        """True in the process that writes the run directory (process 0)."""
        return self.index == 0

    def sync(self, what: str) -> None:
        """Wait until every process is here. Called after each change to the run
        directory; the numbered name makes a process that took another path fail
        at the barrier (when the backend checks names) instead of reading stale files."""
        if self.count > 1:
            assert self.barrier is not None  # configure: more than one process has the backend's barrier
            self._synced += 1
            self.barrier(f"star-engine {self._synced}: {what}")

    def primary_does(self, what: str, action: Callable[[], Any]) -> Any:
        """Run ``action`` (a change to the run directory) in process 0 only, then wait for
        all. Returns what ``action`` returned (None in the other processes)."""
        try:
            return action() if self.primary else None
        finally:  # process 0 failing still releases the others (who then fail on what is missing)
            self.sync(what)

    def stop_others(self, message: str) -> None:
        """Tell the other processes that this one is stopping (best effort: it is already
        failing); they stop at their next barrier with ``ProcessLost``."""
        if self.count > 1 and self.abort is not None:
            try:
                self.abort(message)
            except Exception:  # noqa: BLE001 -- the runtime may already be gone; the error being reported matters
                pass

    @contextmanager
    def stopping_others_on_failure(self) -> Iterator[None]:
        """A failure inside (but another process's loss) tells the others at once, with the
        line the user sees (``boundary``), then goes on up."""
        try:
            yield
        except BaseException as e:
            if not isinstance(e, ProcessLost):
                self.stop_others(f"process {self.index}: {failure_message(e)}")
            raise


def configure(backend: Any, origin: Component | None = None) -> Processes:
    """The process layout of ``backend``: an ``api.MultiProcess`` (see the module
    docstring), or one process. ``origin``: the component the backend was created from, that
    its methods' failures name (``registry.calling``), the barrier's and ``abort``'s too."""

    def call(method: str) -> Callable[..., Any]:
        def named(*args: Any) -> Any:
            with calling(origin, method):
                return getattr(backend, method)(*args)
        return named

    if isinstance(backend, MultiProcess):
        count, index, barrier = int(call("process_count")()), int(call("process_index")()), call("barrier")
    else:
        count = int(call("process_count")()) if hasattr(backend, "process_count") else 1
        index, barrier = 0, None
        if count > 1:
            raise TypeError(f"{type(backend).__name__}: {count} processes but not every method of "
                            "star_engine.api.MultiProcess (process_index, process_count, barrier)")
    if not 0 <= index < max(count, 1):
        raise ValueError(f"{type(backend).__name__}: process_index {index} outside [0, {count})")
    return Processes(index=index, count=count, barrier=barrier,
                     abort=call("abort") if isinstance(backend, Aborts) else None)
