"""The run directory: atomic files, checksums, and a manifest that describes the run.

Every artifact is written to a temporary file in its final folder, fsynced and
renamed into place, then recorded with its sha256 in ``manifest.json`` (itself
written the same way). An artifact counts as done only when the file's sha256
equals the manifest's record, so a crash between the two writes, a truncated
file or a flipped bit all make the stage that produced it run again.

A checkpoint is recorded with its id and the sha256, size and modification time of every
file in it. Resuming checks its files' sizes and modification times against the record (a
checkpoint of a 6B model is ~12 GB: no re-hash); a file whose time differs (rewritten,
or copied without its times) is hashed and compared. Its contents are verified once, when
the backend loads it (the haiku_xmap backend checks a sha256 per leaf).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import stat
import re
import shutil
from pathlib import Path
from typing import Any, TypeVar
from collections.abc import Callable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from . import records
from .procs import Processes
from ..errors import IntegrityError, PluginError, UserError
from .fsio import atomic_write_bytes, is_temporary, json_bytes, sha256_file

MANIFEST = "manifest.json"
R = TypeVar("R")
log = structlog.get_logger("star_engine.rundir.store")


def parquet_bytes(table: pa.Table, metadata: Mapping[str, str] | None = None) -> bytes:
    if metadata:
        meta = dict(table.schema.metadata or {})
        meta.update({k.encode(): v.encode() for k, v in metadata.items()})
        table = table.replace_schema_metadata(meta)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def remove(path: Path) -> None:
    """Remove a file or a folder tree, if there is one."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_temporaries(root: Path) -> int:
    """Remove temporary files and folders left by a killed writer. Returns how many."""
    n = 0
    if not root.exists():
        return 0
    found = [p for p in root.rglob(".*") if is_temporary(p.name)]
    for p in sorted(found, key=lambda q: len(q.parts), reverse=True):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        n += 1
    return n


MANIFEST_MAX = 1 << 30
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def check_regular(path: Path, what: str) -> None:
    """``path``, when it exists, is a regular file (a FIFO or a device would block a reader or
    never end): IntegrityError naming it otherwise; checked before opening."""
    try:
        st = os.stat(path)
    except OSError:
        return  # missing or unreadable: the reader says so
    if not stat.S_ISREG(st.st_mode):
        raise IntegrityError(f"{path}: unreadable {what} (not a regular file)")


def read_json_file(path: Path, max_bytes: int, what: str) -> Any:
    """A JSON file of at most ``max_bytes``; IntegrityError naming it when unreadable."""
    check_regular(path, what)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise IntegrityError(f"{path}: unreadable {what} ({size} bytes, more than the limit of {max_bytes})")
            return json.loads(f.read(size + 1).decode("utf-8"))
    except OSError as e:
        raise IntegrityError(f"{path}: unreadable {what} ({e.strerror or e})") from None
    except RecursionError:
        raise IntegrityError(f"{path}: unreadable {what} (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of >4300 digits
        raise IntegrityError(f"{path}: unreadable {what} ({e})") from None


def _relpath(rel: Any) -> bool:
    """A path inside the run directory: relative, no "..", no empty part."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        return False
    return not rel.startswith("/") and all(part not in ("", ".", "..") for part in rel.split("/"))


def _file_record(rec: Any) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("sha256"), str) and bool(_SHA256.match(rec["sha256"]))
            and type(rec.get("bytes")) is int and rec["bytes"] >= 0
            and ("mtime_ns" not in rec or type(rec["mtime_ns"]) is int))


def check_manifest(m: Any, path: Path) -> dict:
    """``m`` (a run's manifest.json) checked for what the store relies on: every record a
    file inside the run directory with a sha256 and a size; IntegrityError naming the key."""
    def bad(msg: str) -> IntegrityError:
        return IntegrityError(f"{path}: unreadable manifest ({msg}); move the run directory away to start over")

    if not isinstance(m, dict):
        raise bad("not a JSON object")
    for table in ("artifacts", "checkpoints"):
        if not isinstance(m.get(table), dict):
            raise bad(f"'{table}' missing or not an object")
    for rel, rec in m["artifacts"].items():
        if not _relpath(rel) or not _file_record(rec):
            raise bad(f"artifacts[{rel!r}]: expected a path inside the run directory with sha256 and bytes")
    for rel, rec in m["checkpoints"].items():
        if not _relpath(rel):
            raise bad(f"checkpoints[{rel!r}]: not a path inside the run directory")
        if (not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not isinstance(rec.get("files"), dict)
                or not all((n == "." or _relpath(n)) and _file_record(f) for n, f in rec["files"].items())):
            raise bad(f"checkpoints[{rel!r}]: expected an id and the sha256 and bytes of its files")
    if "base_checkpoint" in m and not _relpath(m["base_checkpoint"]):
        raise bad(f"base_checkpoint {m['base_checkpoint']!r}: not a path inside the run directory")
    return m


def read_manifest(root: Path) -> dict | None:
    """The run directory's manifest, checked (None when there is none yet)."""
    path = root / MANIFEST
    if not path.exists():
        return None
    return check_manifest(read_json_file(path, MANIFEST_MAX, "manifest"), path)


class RunStore:
    """Files of one run, addressed by paths relative to the run directory. With several
    ``processes`` process 0 makes every change and each one ends at a barrier (``procs``)."""

    def __init__(self, root: Path, describe: Mapping[str, Any], manifest: dict | None = None,
                 processes: Processes | None = None):
        self.root = root
        self.processes = processes if processes is not None else Processes()
        self._describe = dict(describe)  # resolved config, plugin versions: stamped into Parquet
        if manifest is None:
            manifest = read_manifest(root)
        self.manifest = manifest if manifest is not None else {"artifacts": {}, "checkpoints": {}}

    # -- changes (process 0's) ------------------------------------------------------
    def write_bytes(self, path: Path, data: bytes) -> None:
        """``atomic_write_bytes`` by process 0, every process waiting for it."""
        self.processes.primary_does(f"write {path.name}", lambda: atomic_write_bytes(path, data))

    def remove(self, rel: str) -> None:
        """Remove the file or folder ``rel`` (process 0, every process waiting for it)."""
        self.processes.primary_does(f"remove {rel}", lambda: remove(self.root / rel))

    # -- manifest ------------------------------------------------------------------
    def _save_manifest(self) -> None:
        self.write_bytes(self.root / MANIFEST, json_bytes(self.manifest))

    def set_header(self, **fields: Any) -> None:
        self.manifest.update(fields)
        self._save_manifest()

    def _record(self, rel: str, path: Path) -> None:
        self.manifest["artifacts"][rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        self._save_manifest()

    def done(self, rel: str) -> bool:
        """True when ``rel`` exists and matches its recorded checksum.

        A file that exists but does not match (truncated, flipped, or written
        just before a crash) is removed so that its stage runs again.
        """
        path = self.root / rel
        rec = self.manifest["artifacts"].get(rel)
        if rec is None or not path.exists():
            return False
        if path.stat().st_size == rec["bytes"] and sha256_file(path) == rec["sha256"]:
            return True
        log.warning("damaged_artifact", path=str(path), expected_sha256=rec["sha256"])
        self.remove(rel)
        del self.manifest["artifacts"][rel]
        self._save_manifest()
        return False

    def forget(self, prefix: str) -> None:
        """Drop every record under ``prefix`` (a stage being redone from scratch)."""
        for table in ("artifacts", "checkpoints"):
            for rel in [r for r in self.manifest[table] if r.startswith(prefix)]:
                del self.manifest[table][rel]
        self._save_manifest()

    # -- artifacts -----------------------------------------------------------------
    def write_json(self, rel: str, obj: Any) -> None:
        path = self.root / rel
        self.write_bytes(path, json_bytes(obj))
        self._record(rel, path)

    def read_json(self, rel: str) -> Any:
        return json.loads((self.root / rel).read_text())

    def write_table(self, rel: str, rows: list[dict] | pa.Table, schema: pa.Schema | None = None) -> None:
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=schema)
        meta = {"star_engine": json.dumps(self._describe, sort_keys=True, default=str)}
        path = self.root / rel
        self.write_bytes(path, parquet_bytes(table, meta))
        self._record(rel, path)

    def read_table(self, rel: str) -> pa.Table:
        path = self.root / rel
        check_regular(path, "Parquet file")
        try:
            return pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise IntegrityError(f"{path}: unreadable Parquet file ({e})") from None

    def read_rows(self, rel: str) -> list[dict]:
        return self.read_table(rel).to_pylist()

    def write_records(self, rel: str, recs: Sequence[Any], kind: type, omit: tuple[str, ...] = ()) -> None:
        """Records of ``kind`` as the table ``records.schema(kind, omit)`` (``star_engine.rundir.records``)."""
        self.write_table(rel, records.table(recs, kind, omit))

    def read_records(self, rel: str, kind: type[R]) -> list[R]:
        return records.read(self.read_table(rel), kind, str(self.root / rel))

    # -- checkpoints ---------------------------------------------------------------
    def record_checkpoint(self, rel: str, checkpoint_id: str) -> None:
        """Record a checkpoint: its id and the sha256 and size of every file in it."""
        self.manifest["checkpoints"][rel] = {"id": checkpoint_id, "files": _digest(self.root / rel)}
        self._save_manifest()

    def checkpoint_done(self, rel: str, current_id: Callable[[str], str]) -> bool:
        """True when the checkpoint exists, every file recorded for it is intact (``_intact``:
        metadata reads unless a file's time changed) and it still has its recorded id. A
        damaged checkpoint is removed (its stage runs again) and the damaged files are named
        in the log."""
        rec = self.manifest["checkpoints"].get(rel)
        path = self.root / rel
        if rec is None or not path.exists():
            return False
        damaged = [str(f) for name, want in sorted(rec["files"].items())
                   if not _intact(f := path if name == "." else path / name, want)]
        if not damaged:
            try:
                if current_id(str(path)) != rec["id"]:
                    damaged.append(str(path))
            except (OSError, UserError):
                damaged.append(str(path))
        if not damaged:
            return True
        log.warning("damaged_checkpoint", path=str(path), damaged=damaged)
        self.remove(rel)
        del self.manifest["checkpoints"][rel]
        self._save_manifest()
        return False


@contextlib.contextmanager
def loading_checkpoint(path: Path, inside_run: bool) -> Iterator[None]:
    """Around a backend call that loads the checkpoint at ``path``: a damaged file it finds
    (resuming trusts a file whose size and time are as recorded; the backend verifies the
    contents as it loads them) is named with what to do, when the run wrote the checkpoint."""
    try:
        yield
    except IntegrityError as e:
        if not inside_run or str(path) not in str(e):  # not this checkpoint's file, or not the run's
            raise
        raise IntegrityError(f"{e}; the checkpoint {path} is damaged: move it away and run again to "
                             "redo the stage that wrote it") from None


def _digest(path: Path) -> dict[str, dict[str, Any]]:
    """{name relative to ``path`` ("." for a file checkpoint): sha256, size and modification
    time} of its files."""
    files = [path] if path.is_file() else sorted(q for q in path.rglob("*") if q.is_file())
    out = {}
    for q in files:
        st = q.stat()
        out["." if q == path else q.relative_to(path).as_posix()] = {
            "sha256": sha256_file(q), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return out


def _intact(f: Path, want: Mapping[str, Any]) -> bool:
    """A checkpoint file still as recorded: same size, and the same modification time, or
    (time changed or not recorded: rewritten, copied, or an older manifest) the same sha256."""
    try:
        st = f.stat()
    except OSError:
        return False
    if not f.is_file() or st.st_size != want["bytes"]:
        return False
    return st.st_mtime_ns == want.get("mtime_ns") or sha256_file(f) == want["sha256"]


@contextlib.contextmanager
def disk_full(path: Path) -> Iterator[None]:
    """Name ``path`` when the backend runs out of disk space writing it (the OSError of
    a failed write names no file); the store's records are untouched."""
    try:
        yield
    except PluginError as e:
        if isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC:
            raise UserError(f"{path}: no space left on device while the backend wrote this checkpoint; the run's "
                            f"previous state is intact (free some space and rerun to resume)") from None
        raise
