"""Native checkpoints: a directory written atomically, verified on every load.

Layout::

    <dir>/manifest.msgpack   format, version, model_config, tokenizer, extra, leaves
    <dir>/00000.zst ...      one zstd frame per parameter leaf (raw little-endian bytes)

Each manifest leaf records its key path (``["h_0/attn/q", "w"]``), dtype name,
shape, part file, compressed and raw byte sizes and the sha256 of the raw bytes.
bf16 is stored as its raw 2-byte pattern. The manifest is deterministic (sorted
keys, no timestamps), so ``manifest_sha256`` is a content id.

Loading trusts nothing: the manifest is read with size, length and nesting
limits and no msgpack ext types; its schema is checked; every leaf's dtype and
shape must match both the manifest's sizes and the shapes the model config
implies before any part is read; a part is refused before allocation when its
file size or zstd-declared content size is wrong; decompression streams into an
exactly-sized buffer; sha256 mismatches raise ``IntegrityError`` naming the file.
"""

from __future__ import annotations

import ctypes
import filecmp
import functools
import hashlib
import math
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping

import msgpack
import numpy as np

from star_engine.errors import IntegrityError, UserError

from .safeio import np_dtype, read_bounded, read_zstd_part, unpack_msgpack, write_zstd_part

FORMAT = "star-haiku-xmap-checkpoint"
VERSION = 1
MANIFEST = "manifest.msgpack"
MANIFEST_MAX = 64 << 20
DTYPES = ("float32", "bfloat16", "float16", "int32", "int8", "uint8")
_PART_RE = re.compile(r"^[0-9]{5,}\.zst$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_LEAF_KEYS = {"path", "dtype", "shape", "file", "compressed_bytes", "raw_bytes", "sha256"}


# ----------------------------------------------------------------------------- helpers


def _flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key in sorted(tree):
        if not isinstance(key, str):
            raise TypeError(f"parameter keys must be strings, got {key!r} under {'/'.join(prefix)!r}")
        value = tree[key]
        if isinstance(value, Mapping):
            out.extend(_flatten(value, prefix + (key,)))
        else:
            out.append((prefix + (key,), value))
    return out


def _set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get_path(tree: Any, path: tuple[str, ...], what: str) -> Any:
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            raise UserError(f"{what} has no entry for parameter {'/'.join(path)}")
        tree = tree[key]
    return tree


def _dtype_name(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise TypeError(f"dtype {name} cannot be stored (allowed: {DTYPES})")
    return name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


@functools.lru_cache(maxsize=16)
def _param_specs_cached(config_items: tuple) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    import jax

    from .config import GPTJConfig
    from .model import init_params

    config = GPTJConfig.from_dict(dict(config_items))
    shapes = jax.eval_shape(lambda key: init_params(config, key), jax.random.key(0))
    return {path: (tuple(s.shape), np.dtype(s.dtype).name) for path, s in _flatten(shapes)}


def param_specs(model_config: Mapping[str, Any]) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """{key path: (shape, dtype name)} the model defines for ``model_config`` (no memory used)."""
    return _param_specs_cached(tuple(sorted(model_config.items())))


# ----------------------------------------------------------------------------- save


def _manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
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
                    tokenizer: dict, extra: dict | None = None) -> dict:
    """Write ``params`` (nested dict of arrays, host or device) to the directory ``path``.

    Written into a temporary sibling directory (files and directory fsynced), then
    moved into place: a missing ``path`` is created by rename, an existing
    checkpoint is swapped atomically (or left alone when byte-identical), anything
    else at ``path`` is refused. Leaves are fetched to host one at a time and must
    match the shapes and dtypes ``model_config`` implies. Returns the manifest.
    """
    return write_checkpoint(path, _flatten(params), model_config=model_config, tokenizer=tokenizer, extra=extra)


def write_checkpoint(path: str | os.PathLike, leaves: Iterable[tuple[tuple[str, ...], Any]], *,
                     model_config: dict, tokenizer: dict, extra: dict | None = None) -> dict:
    """``save_checkpoint`` for a stream of ``(key path, array)`` pairs, consumed one
    at a time (a converter can yield leaves without holding the whole model)."""
    import jax

    dest = Path(path)
    if dest.exists() and not (dest.is_dir() and ((dest / MANIFEST).is_file() or not any(dest.iterdir()))):
        raise UserError(f"{dest}: exists and is not a checkpoint; refusing to replace it")
    try:
        specs = param_specs(model_config)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{dest}: model_config is not a valid GPT-J config ({exc})") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        entries, seen = [], set()
        for index, (key_path, value) in enumerate(leaves):
            key_path = tuple(key_path)
            arr = np.asarray(jax.device_get(value))
            name = _dtype_name(arr.dtype)
            want = specs.get(key_path)
            if want is None or key_path in seen:
                raise UserError(f"{dest}: unexpected or repeated parameter {'/'.join(key_path)}")
            if (arr.shape, name) != want:
                raise UserError(f"{dest}: {'/'.join(key_path)} is {name}{list(arr.shape)}, "
                                f"the model config needs {want[1]}{list(want[0])}")
            seen.add(key_path)
            arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            raw = memoryview(arr.reshape(-1).view(np.uint8))
            part = f"{index:05d}.zst"
            compressed, sha = write_zstd_part(tmp / part, raw)
            entries.append({"path": list(key_path), "dtype": name, "shape": list(arr.shape), "file": part,
                            "compressed_bytes": compressed, "raw_bytes": arr.nbytes, "sha256": sha})
            del arr, raw, value
        missing = sorted(set(specs) - seen)
        if missing:
            raise UserError(f"{dest}: parameters missing: {['/'.join(p) for p in missing][:5]}")
        manifest = {"format": FORMAT, "version": VERSION, "model_config": dict(model_config),
                    "tokenizer": dict(tokenizer), "extra": dict(extra or {}), "leaves": entries}
        data = _manifest_bytes(manifest)
        if len(data) > MANIFEST_MAX:
            raise UserError(f"{dest}: manifest of {len(data)} bytes exceeds {MANIFEST_MAX}")
        with open(tmp / MANIFEST, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        manifest = unpack_msgpack(data, what=str(dest / MANIFEST))  # the exact form a load returns
        _publish(tmp, dest, data, entries)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, dest: Path, data: bytes, entries: list[dict]) -> None:
    """Move the finished ``tmp`` to ``dest``; afterwards ``tmp`` holds nothing of value."""
    if not dest.exists():
        os.rename(tmp, dest)
    elif _same_checkpoint(dest, tmp, data, entries):
        return  # identical: leave it alone
    elif not _exchange(tmp, dest):  # the swap leaves the old checkpoint at tmp
        old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(dest, old)  # fallback: a short window where dest is absent, never a torn one
        os.rename(tmp, dest)
        os.rename(old, tmp)
    _fsync_dir(dest.parent)


def _same_checkpoint(dest: Path, tmp: Path, data: bytes, entries: list[dict]) -> bool:
    try:
        if read_bounded(dest / MANIFEST, MANIFEST_MAX) != data:
            return False
    except IntegrityError:
        return False
    return all((dest / e["file"]).is_file() and filecmp.cmp(dest / e["file"], tmp / e["file"], shallow=False)
               for e in entries)


# ----------------------------------------------------------------------------- load


def manifest_sha256(path: str | os.PathLike) -> str:
    """sha256 of the checkpoint's manifest: a content id (the manifest holds every part's sha256)."""
    return hashlib.sha256(read_bounded(Path(path) / MANIFEST, MANIFEST_MAX)).hexdigest()


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of checkpoint ``path``, schema-checked (parts are not read)."""
    where = str(Path(path) / MANIFEST)
    m = unpack_msgpack(read_bounded(Path(path) / MANIFEST, MANIFEST_MAX), what=where)

    def bad(msg: str) -> IntegrityError:
        return IntegrityError(f"{where}: {msg}")

    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} manifest")
    if m.get("version") != VERSION:
        raise bad(f"unsupported version {m.get('version')!r} (this reader knows {VERSION})")
    for key in ("model_config", "tokenizer", "extra"):
        if not isinstance(m.get(key), dict):
            raise bad(f"field {key!r} missing or not a map")
    leaves = m.get("leaves")
    if not isinstance(leaves, list):
        raise bad("field 'leaves' missing or not a list")
    files, paths = set(), set()
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, dict) or set(leaf) != _LEAF_KEYS:
            raise bad(f"leaf {i}: must have exactly the fields {sorted(_LEAF_KEYS)}")
        p, shape = leaf["path"], leaf["shape"]
        if not isinstance(p, list) or not p or not all(isinstance(k, str) and k for k in p):
            raise bad(f"leaf {i}: bad path {p!r}")
        if tuple(p) in paths:
            raise bad(f"leaf {i}: duplicate path {'/'.join(p)}")
        if leaf["dtype"] not in DTYPES:
            raise bad(f"leaf {'/'.join(p)}: dtype {leaf['dtype']!r} not allowed")
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape):
            raise bad(f"leaf {'/'.join(p)}: bad shape {shape!r}")
        if not isinstance(leaf["file"], str) or not _PART_RE.match(leaf["file"]) or leaf["file"] in files:
            raise bad(f"leaf {'/'.join(p)}: bad or duplicate part file name {leaf['file']!r}")
        for key in ("compressed_bytes", "raw_bytes"):
            if type(leaf[key]) is not int or leaf[key] < 0:
                raise bad(f"leaf {'/'.join(p)}: bad {key} {leaf[key]!r}")
        if not isinstance(leaf["sha256"], str) or not _SHA_RE.match(leaf["sha256"]):
            raise bad(f"leaf {'/'.join(p)}: bad sha256")
        if math.prod(shape) * np_dtype(leaf["dtype"]).itemsize != leaf["raw_bytes"]:
            raise bad(f"leaf {'/'.join(p)}: {leaf['dtype']} x {shape} does not make {leaf['raw_bytes']} bytes")
        paths.add(tuple(p))
        files.add(leaf["file"])
    return m


def _check_against_config(m: dict, where: str) -> None:
    try:
        specs = param_specs(m["model_config"])
    except (TypeError, ValueError) as exc:
        raise IntegrityError(f"{where}: model_config is not a valid GPT-J config ({exc})") from None
    have = {tuple(leaf["path"]): leaf for leaf in m["leaves"]}
    missing, unexpected = sorted(set(specs) - set(have)), sorted(set(have) - set(specs))
    if missing or unexpected:
        raise IntegrityError(f"{where}: parameters do not match the model config: missing "
                             f"{['/'.join(p) for p in missing][:5]}, unexpected {['/'.join(p) for p in unexpected][:5]}")
    for key_path, (shape, dtype) in specs.items():
        leaf = have[key_path]
        if tuple(leaf["shape"]) != shape or leaf["dtype"] != dtype:
            raise IntegrityError(f"{where}: {'/'.join(key_path)} is {leaf['dtype']}{leaf['shape']}, the model "
                                 f"config needs {dtype}{list(shape)}")


def load_checkpoint(path: str | os.PathLike, shardings: Any = None) -> tuple[dict, dict]:
    """Load and verify checkpoint ``path``; returns (params, manifest).

    ``shardings``: None (each leaf on the default device) or a nested dict of
    ``jax.sharding.Sharding`` with the params' structure; each leaf is then built
    with ``jax.make_array_from_callback`` from its host copy, one leaf at a time.
    """
    import jax

    root = Path(path)
    if not (root / MANIFEST).is_file():
        raise IntegrityError(f"{root}: not a checkpoint (no {MANIFEST})")
    m = read_manifest(root)
    _check_against_config(m, str(root / MANIFEST))
    if shardings is not None:  # fail on a structure mismatch before reading any part
        for leaf in m["leaves"]:
            _get_path(shardings, tuple(leaf["path"]), "shardings")
    params: dict = {}
    for leaf in m["leaves"]:
        key_path = tuple(leaf["path"])
        raw = read_zstd_part(root / leaf["file"], compressed_bytes=leaf["compressed_bytes"],
                             raw_bytes=leaf["raw_bytes"], sha256=leaf["sha256"])
        host = raw.view(np_dtype(leaf["dtype"]).newbyteorder("<")).reshape(leaf["shape"])
        host = host.astype(np_dtype(leaf["dtype"]), copy=False)
        if shardings is None:
            value = jax.device_put(host)
        else:
            sharding = _get_path(shardings, key_path, "shardings")
            value = jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx])
        value.block_until_ready()
        _set_path(params, key_path, value)
        del raw, host
    return params, m
