"""Writing native checkpoints (the format and its reader: ``format.py``):
``save_checkpoint`` for a params tree, ``write_checkpoint`` for a stream of leaves,
both published atomically (``_publish``)."""

from __future__ import annotations

import ctypes
import filecmp
import os
import shutil
from pathlib import Path
from typing import Any, cast
from collections.abc import Iterable, Mapping

import msgpack
import numpy as np

from star_engine import IntegrityError, UserError
from star_engine.helpers import fsync_dir, temporary_sibling

from .format import (DTYPES, FORMAT, MANIFEST, MANIFEST_MAX, VERSION, VERSION_SPLIT, flatten, param_specs,
                         part_files)
from .safeio import make_parents, read_bounded, remove_created, unpack_msgpack, write_zstd_part


def _dtype_name(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"dtype {name} cannot be stored (allowed: {DTYPES})")
    return name


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The canonical msgpack encoding of a manifest (sorted keys, numpy scalars as Python's)."""
    def canon(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {str(k): canon(x[k]) for k in sorted(x, key=str)}
        if isinstance(x, (list, tuple)):
            return [canon(v) for v in x]
        if isinstance(x, (np.integer, np.floating, np.bool_)):
            return x.item()
        return x

    return msgpack.packb(canon(manifest), use_bin_type=True)


def save_checkpoint(path: str | os.PathLike, params: Mapping[str, Any], *, model_config: dict,
                    tokenizer: dict, extra: dict | None = None, mp_split: int = 1,
                    specs: Mapping[tuple[str, ...], tuple[tuple[int, ...], str]] | None = None) -> dict:
    """Write ``params`` (nested dict of arrays, host or device) to the directory ``path``.

    Written into a temporary sibling directory (files and directory fsynced), then
    moved into place: a missing ``path`` is created by rename, an existing
    checkpoint is swapped atomically (or left alone when byte-identical), anything
    else at ``path`` is refused. Leaves are fetched to host one at a time and must
    match the shapes and dtypes ``model_config`` implies. ``mp_split`` > 1 stores the
    mp-sharded leaves as that many parts (version 2). ``specs``: the leaves expected when
    they are not the model's parameters (``write_checkpoint``). Returns the manifest.
    """
    return write_checkpoint(path, flatten(params), model_config=model_config, tokenizer=tokenizer, extra=extra,
                            mp_split=mp_split, specs=specs)


def split_axis_for(key_path: tuple[str, ...], shape: tuple[int, ...], mp_split: int) -> int | None:
    """The axis a leaf is stored split along for ``mp_split`` parts: the dimension the
    sharding rules put on "mp", when ``mp_split`` > 1 divides it; else None."""
    if mp_split <= 1 or len(key_path) < 2:
        return None
    from ..runtime.sharding import spec_for  # jax: the format is written without it unless split for a mesh

    try:  # {module: {name: leaf}} ends every params-like tree (moments too, resume.py)
        spec = spec_for(f"{key_path[-2]}/{key_path[-1]}", shape)
    except (KeyError, ValueError):
        return None
    for axis, name in enumerate(spec):
        if name == "mp" and shape[axis] % mp_split == 0:
            return axis
    return None


def write_checkpoint(path: str | os.PathLike, leaves: Iterable[tuple[tuple[str, ...], Any]], *,
                     model_config: dict, tokenizer: dict, extra: dict | None = None, mp_split: int = 1,
                     specs: Mapping[tuple[str, ...], tuple[tuple[int, ...], str]] | None = None) -> dict:
    """``save_checkpoint`` for a stream of ``(key path, array)`` pairs, consumed one
    at a time (a converter can yield leaves without holding the whole model).

    ``mp_split`` > 1 writes a version-2 checkpoint whose mp-sharded leaves are
    stored as ``mp_split`` parts (see ``format.py``). ``specs``: the leaves
    expected, {key path: (shape, dtype name)} (default: the model's parameters,
    ``param_specs``; a training snapshot passes its state's, ``resume.py``)."""
    if isinstance(mp_split, bool) or not isinstance(mp_split, int) or mp_split < 1:
        raise UserError(f"mp_split must be an int >= 1, got {mp_split!r}")

    dest = Path(path)
    if dest.exists() and not (dest.is_dir() and ((dest / MANIFEST).is_file() or not any(dest.iterdir()))):
        raise UserError(f"{dest}: exists and is not a checkpoint; refusing to replace it")
    try:
        specs = param_specs(model_config) if specs is None else specs
    except (TypeError, ValueError) as exc:
        raise UserError(f"{dest}: model_config is not a valid GPT-J config ({exc})") from None
    created = make_parents(dest)  # taken away again if the write fails
    tmp = temporary_sibling(dest)
    tmp.mkdir()
    published = False
    try:
        entries, seen = [], set()
        raw: memoryview | None
        for index, (key_path, value) in enumerate(leaves):
            key_path = tuple(key_path)
            arr = np.asarray(value)  # a device array is fetched (jax's __array__)
            name = _dtype_name(arr.dtype)
            want = specs.get(key_path)
            if want is None or key_path in seen:
                raise UserError(f"{dest}: unexpected or repeated parameter {'/'.join(key_path)}")
            if (arr.shape, name) != want:
                raise UserError(f"{dest}: {'/'.join(key_path)} is {name}{list(arr.shape)}, "
                                f"the model config needs {want[1]}{list(want[0])}")
            seen.add(key_path)
            # (reshaped: ascontiguousarray makes a 0-d array, a step count, 1-d)
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).reshape(arr.shape)
            axis = split_axis_for(key_path, arr.shape, mp_split)
            if axis is None:
                raw = memoryview(cast(Any, arr.reshape(-1).view(np.uint8)))
                part = f"{index:05d}.zst"
                compressed, sha = write_zstd_part(tmp / part, raw)
                entries.append({"path": list(key_path), "dtype": name, "shape": list(arr.shape), "file": part,
                                "compressed_bytes": compressed, "raw_bytes": arr.nbytes, "sha256": sha})
            else:
                parts = []
                for k, piece in enumerate(np.split(arr, mp_split, axis=axis)):
                    piece = np.ascontiguousarray(piece)
                    part = f"{index:05d}.{k:03d}.zst"
                    compressed, sha = write_zstd_part(tmp / part,
                                                      memoryview(cast(Any, piece.reshape(-1).view(np.uint8))))
                    parts.append({"file": part, "compressed_bytes": compressed, "raw_bytes": piece.nbytes,
                                  "sha256": sha})
                    del piece
                entries.append({"path": list(key_path), "dtype": name, "shape": list(arr.shape),
                                "split_axis": axis, "parts": parts})
            raw = None
            del arr, raw, value
        missing = sorted(set(specs) - seen)
        if missing:
            raise UserError(f"{dest}: parameters missing: {['/'.join(p) for p in missing][:5]}")
        split = any("parts" in e for e in entries)
        manifest = {"format": FORMAT, "version": VERSION_SPLIT if split else VERSION,
                    "model_config": dict(model_config), "tokenizer": dict(tokenizer), "extra": dict(extra or {}),
                    "leaves": entries}
        if split:
            manifest["mp_split"] = mp_split
        data = manifest_bytes(manifest)
        if len(data) > MANIFEST_MAX:
            raise UserError(f"{dest}: manifest of {len(data)} bytes exceeds {MANIFEST_MAX}")
        with open(tmp / MANIFEST, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        manifest = unpack_msgpack(data, what=str(dest / MANIFEST))  # the exact form a load returns
        _publish(tmp, dest, data, entries)
        published = True
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not published:
            remove_created(created)


def _publish(tmp: Path, dest: Path, data: bytes, entries: list[dict]) -> None:
    """Move the finished ``tmp`` to ``dest``; afterwards ``tmp`` holds nothing of value."""
    if not dest.exists():
        os.rename(tmp, dest)
    elif _same_checkpoint(dest, tmp, data, entries):
        return  # identical: leave it alone
    elif not _exchange(tmp, dest):  # the swap leaves the old checkpoint at tmp
        # Fallback: a short window where dest is absent, never a torn one. The name is a
        # temporary's (fsio.temporary_sibling), so a run killed inside the window has it cleaned
        # away on restart (star_engine.rundir.store.clean_temporaries) and redoes the stage.
        old = temporary_sibling(dest, "old")
        os.rename(dest, old)
        os.rename(tmp, dest)
        os.rename(old, tmp)
    fsync_dir(dest.parent)


def _same_checkpoint(dest: Path, tmp: Path, data: bytes, entries: list[dict]) -> bool:
    try:
        if read_bounded(dest / MANIFEST, MANIFEST_MAX) != data:
            return False
    except IntegrityError:
        return False
    files = [f for e in entries for f in part_files(e)]
    return all((dest / f).is_file() and filecmp.cmp(dest / f, tmp / f, shallow=False) for f in files)

