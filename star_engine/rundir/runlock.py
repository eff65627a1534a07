"""The lock that keeps a run directory to one run at a time.

The lock is ``fcntl.flock`` on ``RUN_DIR/.lock``, taken by ``run`` (process 0 of a
multi-process run, for all of them) before its first write and held until the
command ends (``boundary.run_command`` releases it). A second ``run`` of the same
directory is refused at once; the operating system releases the lock when its holder
dies (``kill -9`` too), so a rerun resumes. ``report``, ``validate``, ``show`` and ``status``
only read and never lock (``holder`` says who holds it).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from ..errors import UserError

LOCK = ".lock"

_held: dict[Path, int] = {}  # the run directories this process holds locked, and the lock files' descriptors


def lock(root: Path) -> None:
    """Take the run directory's lock (creating the folder), or refuse at once when another
    run holds it. Held until ``release_locks`` (the end of the command) or the process's death."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = b""
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            try:
                holder = os.pread(fd, 512, 0)
            except OSError:
                pass
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            who = holder.decode("utf-8", "replace").strip().replace("\n", " ") or "holder unknown"
            raise UserError(f"{root}: another star-engine run is using this run directory ({who}); wait until it "
                            f"ends, or set experiment.output_dir to another folder") from None
        raise UserError(f"{path}: cannot lock the run directory ({e.strerror or e}); star-engine needs a "
                        f"filesystem with file locks (flock) to keep one run per directory") from None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    note = f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, note, 0)
    except OSError:
        pass  # the note only helps the message of a refused second run
    _held[root] = fd


def holder(root: Path) -> str | None:
    """Who holds ``root``'s lock: its note ("pid N on HOST since TIME", or "holder unknown") while
    a run holds it, None when none does (``star-engine status``). Reads only: it tries a shared
    lock for an instant (a ``run`` starting in that instant is refused, as for a second run)."""
    try:
        fd = os.open(root / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # no lock file: never run, or not here
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            try:
                note = os.pread(fd, 512, 0)
            except OSError:
                note = b""
            return note.decode("utf-8", "replace").strip().replace("\n", " ") or "holder unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def release(root: Path) -> None:
    """Release ``root``'s lock, when this process holds it: its run ended while the command goes
    on (``run --seeds``, a sweep: the next member runs, and ``status`` of this one says finished)."""
    fd = _held.pop(root, None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def release_locks() -> None:
    """Release the locks this process holds (the command ended)."""
    for root in list(_held):
        release(root)
