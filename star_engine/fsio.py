"""File helpers the core and the backends share: a file's sha256, a durable directory
entry, and the one naming rule for temporaries (a writer's file or folder that a run killed
mid-write leaves behind, removed when the run restarts). Standard library only, so that a
backend's checkpoint reader imports it under a tight memory cap (no pyarrow)."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

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
    killed mid-write has it removed on restart (``star_engine.store.clean_temporaries``).
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
