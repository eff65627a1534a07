"""File helpers the core and the backends share: a file's sha256 and a durable directory
entry. Standard library only, so that a backend's checkpoint reader imports it under a
tight memory cap (no pyarrow)."""

from __future__ import annotations

import hashlib
import os


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
