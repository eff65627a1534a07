"""File helpers the core and the backends share: a file's sha256, a durable directory
entry, atomic writes (``atomic_write_bytes``, ``atomic_write_json``), and the one naming rule for temporaries (a writer's file or folder that a run killed
mid-write leaves behind, removed when the run restarts). Standard library only, so that a
backend's checkpoint reader imports it under a tight memory cap (no pyarrow)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from ..errors import UserError

TMP_MARK = ".tmp-"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks (the one helper the core and backends share)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in directory ``path`` durable (after fsyncing the file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_sibling(dest: str | os.PathLike, tag: str = "") -> Path:
    """A fresh name beside ``dest`` to build it under before renaming it into place:
    ``.<name>.tmp-[<tag>-]<random>``. Hidden, and a temporary by ``is_temporary``, so a run
    killed mid-write has it removed on restart (``star_engine.rundir.store.clean_temporaries``).
    Backends writing inside the run directory name their temporaries with it."""
    dest = Path(dest)
    return dest.with_name(f".{dest.name}{TMP_MARK}{tag + '-' if tag else ''}{uuid.uuid4().hex[:12]}")


def in_the_way(path: Path, folder: bool = False) -> bool:
    """Whether something other than a file (``folder``: a folder) is at ``path``, a dangling
    link included: writing one there would fail, so a writer checks before it starts."""
    return (path.exists() or path.is_symlink()) and not (path.is_dir() if folder else path.is_file())


def is_temporary(name: str) -> bool:
    """A temporary's name: the run store's (``.tmp-<name>.<pid>``) or ``temporary_sibling``'s."""
    return name.startswith(TMP_MARK) or (name.startswith(".") and TMP_MARK in name)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix.
    (In a run directory of several processes, through ``RunStore`` or ``Processes.primary_does``.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_MARK}{path.name}.{os.getpid()}")  # a temporary by fsio.is_temporary
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if e.errno == errno.ENOSPC:
            raise UserError(f"{path}: no space left on device; the previous version is intact") from None
        raise


def json_bytes(obj: Any) -> bytes:
    """How the run directory's JSON files are written (indented, keys sorted)."""
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json_bytes(obj))
