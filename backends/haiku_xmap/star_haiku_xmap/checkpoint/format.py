"""Native checkpoints: a directory written atomically, verified on every load.

Layout::

    <dir>/manifest.msgpack   format, version, model_config, tokenizer, extra, leaves
    <dir>/00000.zst ...      one zstd frame per parameter leaf (raw little-endian bytes)

Each manifest leaf records its key path (``["h_0/attn/q", "w"]``), dtype name,
shape, part file, compressed and raw byte sizes and the sha256 of the raw bytes.
bf16 is stored as its raw 2-byte pattern. The manifest is deterministic (sorted
keys, no timestamps), so ``manifest_sha256`` is a content id.

Version 2 (``write_checkpoint(..., mp_split=N)``, N > 1) is the same layout with
every leaf that the sharding rules split over "mp" (and whose split dimension N
divides) stored as N parts, ``<leaf>.<part>.zst``, each the contiguous slice
``k`` of N along ``split_axis``; such a leaf's entry has ``split_axis`` and
``parts`` (a list of ``{file, compressed_bytes, raw_bytes, sha256}``) instead of
the single-part fields. A device then decompresses only the parts that overlap
its own slice: on an mp=N mesh, exactly one part per split leaf. The values are
identical to the unsplit checkpoint's; only the storage differs.

Loading trusts nothing: the manifest is read with size, length and nesting
limits and no msgpack ext types; its schema is checked; every leaf's dtype and
shape must match both the manifest's sizes and the shapes the model config
implies before any part is read; a part is refused before allocation when its
file size or zstd-declared content size is wrong; decompression streams into an
exactly-sized buffer; sha256 mismatches raise ``IntegrityError`` naming the file.

This module reads (and defines the format's constants and parameter specs);
``write.py`` writes.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Mapping

import numpy as np

from star_engine import IntegrityError, UserError

from ..model.config import MAX_LAYERS, config_from_dict

from .safeio import check_alloc, np_dtype, read_bounded, read_zstd_part, unpack_msgpack

FORMAT = "star-haiku-xmap-checkpoint"
VERSION = 1
VERSION_SPLIT = 2  # some leaves stored as per-mp-shard parts
READ_VERSIONS = (VERSION, VERSION_SPLIT)
MANIFEST = "manifest.msgpack"
MANIFEST_MAX = 64 << 20
DTYPES = ("float32", "bfloat16", "float16", "int32", "int8", "uint8")
_PART_RE = re.compile(r"^[0-9]{5,}\.zst$")
_SPLIT_PART_RE = re.compile(r"^[0-9]{5,}\.[0-9]{3,}\.zst$")
_SPLIT_LEAF_KEYS = {"path", "dtype", "shape", "split_axis", "parts"}
_PART_KEYS = {"file", "compressed_bytes", "raw_bytes", "sha256"}
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_LEAF_KEYS = {"path", "dtype", "shape", "file", "compressed_bytes", "raw_bytes", "sha256"}


# ----------------------------------------------------------------------------- helpers


def flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """``(key path, leaf)`` of a nested dict of string keys, in sorted key order: a checkpoint's leaf order."""
    out = []
    for key in sorted(tree):
        if not isinstance(key, str):
            raise TypeError(f"parameter keys must be strings, got {key!r} under {'/'.join(prefix)!r}")
        value = tree[key]
        if isinstance(value, Mapping):
            out.extend(flatten(value, prefix + (key,)))
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


@functools.lru_cache(maxsize=16)
def _param_specs_cached(config_items: tuple) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    from ..model import network  # jax: the format is read without it (export, preflight, ids); shapes need it

    shapes = network.param_shapes(config_from_dict(dict(config_items)))
    return {path: (tuple(s.shape), np.dtype(s.dtype).name) for path, s in flatten(shapes)}


def param_specs(model_config: Mapping[str, Any]) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """{key path: (shape, dtype name)} the model defines for ``model_config`` (no memory used).
    ValueError/TypeError for a config that is not a model's (or has more than MAX_LAYERS layers)."""
    layers = model_config.get("n_layer")
    if type(layers) is int and layers > MAX_LAYERS:
        raise ValueError(f"n_layer {layers} is more than {MAX_LAYERS}")
    try:
        items = ((k, tuple(v) if isinstance(v, list) else v) for k, v in model_config.items())
        return _param_specs_cached(tuple(sorted(items)))
    except (OverflowError, ArithmeticError) as exc:
        raise ValueError(f"shapes out of range ({exc})") from None


def part_files(leaf: Mapping[str, Any]) -> list[str]:
    """The part file names of one manifest leaf entry (one, or one per split part)."""
    return [p["file"] for p in leaf["parts"]] if "parts" in leaf else [leaf["file"]]


# ----------------------------------------------------------------------------- manifest


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
    if m.get("version") not in READ_VERSIONS:
        raise bad(f"unsupported version {m.get('version')!r} (this reader knows {list(READ_VERSIONS)})")
    split_ok = m["version"] == VERSION_SPLIT
    if split_ok and (type(m.get("mp_split")) is not int or m["mp_split"] < 2):
        raise bad(f"version {VERSION_SPLIT} needs an int mp_split >= 2, got {m.get('mp_split')!r}")
    for key in ("model_config", "tokenizer", "extra"):
        if not isinstance(m.get(key), dict):
            raise bad(f"field {key!r} missing or not a map")
    leaves = m.get("leaves")
    if not isinstance(leaves, list):
        raise bad("field 'leaves' missing or not a list")
    files: set[str] = set()
    paths: set[tuple[str, ...]] = set()
    for i, leaf in enumerate(leaves):
        if split_ok and isinstance(leaf, dict) and set(leaf) == _SPLIT_LEAF_KEYS:
            _check_split_leaf(leaf, i, m["mp_split"], files, paths, bad)
            continue
        if not isinstance(leaf, dict) or set(leaf) != _LEAF_KEYS:
            raise bad(f"leaf {i}: must have exactly the fields {sorted(_LEAF_KEYS)}")
        name, shape = _check_leaf_head(leaf, i, paths, bad), leaf["shape"]
        if not isinstance(leaf["file"], str) or not _PART_RE.match(leaf["file"]) or leaf["file"] in files:
            raise bad(f"leaf {name}: bad or duplicate part file name {leaf['file']!r}")
        for key in ("compressed_bytes", "raw_bytes"):
            if type(leaf[key]) is not int or leaf[key] < 0:
                raise bad(f"leaf {name}: bad {key} {leaf[key]!r}")
        if not isinstance(leaf["sha256"], str) or not _SHA_RE.match(leaf["sha256"]):
            raise bad(f"leaf {name}: bad sha256")
        if math.prod(shape) * np_dtype(leaf["dtype"]).itemsize != leaf["raw_bytes"]:
            raise bad(f"leaf {name}: {leaf['dtype']} x {shape} does not make {leaf['raw_bytes']} bytes")
        paths.add(tuple(leaf["path"]))
        files.add(leaf["file"])
    return m


def _check_leaf_head(leaf: dict, i: int, paths: set, bad) -> str:
    """Path (well formed, not seen before), dtype and shape of manifest leaf ``i``,
    split or not. Returns the path joined with "/"."""
    p, shape = leaf["path"], leaf["shape"]
    if not isinstance(p, list) or not p or not all(isinstance(k, str) and k for k in p):
        raise bad(f"leaf {i}: bad path {p!r}")
    name = "/".join(p)
    if tuple(p) in paths:
        raise bad(f"leaf {i}: duplicate path {name}")
    if leaf["dtype"] not in DTYPES:
        raise bad(f"leaf {name}: dtype {leaf['dtype']!r} not allowed")
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape):
        raise bad(f"leaf {name}: bad shape {shape!r}")
    return name


def _check_split_leaf(leaf: dict, i: int, n: int, files: set, paths: set, bad) -> None:
    """Schema of a version-2 split leaf: N equal slices along ``split_axis``."""
    name = _check_leaf_head(leaf, i, paths, bad)
    shape, axis, parts = leaf["shape"], leaf["split_axis"], leaf["parts"]
    if type(axis) is not int or not 0 <= axis < len(shape) or shape[axis] % n:
        raise bad(f"leaf {name}: split_axis {axis!r} cannot split shape {shape} into {n} parts")
    if not isinstance(parts, list) or len(parts) != n:
        raise bad(f"leaf {name}: needs exactly {n} parts")
    part_bytes = math.prod(shape) // n * np_dtype(leaf["dtype"]).itemsize
    for part in parts:
        if not isinstance(part, dict) or set(part) != _PART_KEYS:
            raise bad(f"leaf {name}: a part must have exactly the fields {sorted(_PART_KEYS)}")
        if not isinstance(part["file"], str) or not _SPLIT_PART_RE.match(part["file"]) or part["file"] in files:
            raise bad(f"leaf {name}: bad or duplicate part file name {part['file']!r}")
        if type(part["compressed_bytes"]) is not int or part["compressed_bytes"] < 0:
            raise bad(f"leaf {name}: bad compressed_bytes {part['compressed_bytes']!r}")
        if type(part["raw_bytes"]) is not int or part["raw_bytes"] != part_bytes:
            raise bad(f"leaf {name}: part of {part['raw_bytes']!r} bytes, {leaf['dtype']} x {shape} / {n} "
                      f"makes {part_bytes}")
        if not isinstance(part["sha256"], str) or not _SHA_RE.match(part["sha256"]):
            raise bad(f"leaf {name}: bad sha256")
        files.add(part["file"])
    paths.add(tuple(leaf["path"]))


def checked_manifest(path: str | os.PathLike) -> dict:
    """The manifest of checkpoint ``path``, schema-checked and checked against the parameters its
    model config implies (parts are not read); IntegrityError when ``path`` holds no checkpoint."""
    root = Path(path)
    if not (root / MANIFEST).is_file():
        raise IntegrityError(f"{root}: not a checkpoint (no {MANIFEST})")
    m = read_manifest(root)
    _check_against_config(m, str(root / MANIFEST))
    return m


def _check_against_config(m: dict, where: str) -> None:
    try:
        specs = param_specs(m["model_config"])
    except (TypeError, ValueError) as exc:
        raise IntegrityError(f"{where}: model_config is not a valid GPT-J config ({exc})") from None
    extra = m.get("extra")
    if isinstance(extra, dict) and extra.get("kind") == "lora":  # adapters alone, over a base
        from ..model.lora import checkpoint_specs  # jax (haiku), as _param_specs_cached

        try:
            specs = checkpoint_specs(m["model_config"], extra)
        except (UserError, TypeError, ValueError, KeyError) as exc:
            raise IntegrityError(f"{where}: not a valid LoRA checkpoint ({exc})") from None
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


# ----------------------------------------------------------------------------- leaves


def load_checkpoint(path: str | os.PathLike, shardings: Any = None) -> tuple[dict, dict]:
    """Load and verify checkpoint ``path``; returns (params, manifest).

    ``shardings``: None (each leaf on the default device) or a nested dict of
    ``jax.sharding.Sharding`` with the params' structure; each leaf is then built
    with ``jax.make_array_from_callback`` from its host copy, one leaf at a time.
    """
    import jax  # the format is read without jax (export, preflight, ids); loading puts leaves on devices

    root = Path(path)
    m = checked_manifest(root)
    if shardings is not None:  # fail on a structure mismatch before reading any part
        for leaf in m["leaves"]:
            _get_path(shardings, tuple(leaf["path"]), "shardings")
    params: dict = {}
    for leaf in m["leaves"]:
        key_path = tuple(leaf["path"])
        if shardings is None:
            host = read_leaf(root, leaf)
            value = jax.device_put(host)
            del host
        else:
            value = load_leaf_sharded(root, leaf, _get_path(shardings, key_path, "shardings"))
        value.block_until_ready()
        _set_path(params, key_path, value)
    return params, m


def _read_part(root: Path, part: Mapping[str, Any], dtype: str, shape: list[int]) -> np.ndarray:
    raw = read_zstd_part(root / part["file"], compressed_bytes=part["compressed_bytes"],
                         raw_bytes=part["raw_bytes"], sha256=part["sha256"])
    host = raw.view(np_dtype(dtype).newbyteorder("<")).reshape(shape)
    return host.astype(np_dtype(dtype), copy=False)


def _part_shape(leaf: Mapping[str, Any]) -> list[int]:
    shape = list(leaf["shape"])
    shape[leaf["split_axis"]] //= len(leaf["parts"])
    return shape


def read_leaf(root: str | os.PathLike, leaf: Mapping[str, Any]) -> np.ndarray:
    """One whole leaf (all of its parts), verified, as a host array."""
    root = Path(root)
    if "parts" not in leaf:
        return _read_part(root, leaf, leaf["dtype"], leaf["shape"])
    check_alloc(2 * math.prod(leaf["shape"]) * np_dtype(leaf["dtype"]).itemsize, str(root / leaf["parts"][0]["file"]))
    pieces = [_read_part(root, p, leaf["dtype"], _part_shape(leaf)) for p in leaf["parts"]]
    return np.concatenate(pieces, axis=leaf["split_axis"])


def _normalize_index(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(start, stop) per dimension for a device's index (a tuple of unit-step slices)."""
    out = []
    for dim, size in enumerate(shape):
        s = index[dim] if dim < len(index) else slice(None)
        start, stop, step = s.indices(size)
        if step != 1:
            raise ValueError(f"unsupported strided shard index {index}")
        out.append((start, stop))
    return tuple(out)


def read_leaf_slice(root: str | os.PathLike, leaf: Mapping[str, Any], bounds: tuple[tuple[int, int], ...],
                    whole: np.ndarray | None = None) -> np.ndarray:
    """The block ``bounds`` ((start, stop) per dimension) of a leaf as a fresh host array.

    A split leaf decompresses only the parts that overlap the block along its
    split axis; an unsplit one is sliced from ``whole`` (read when not given)."""
    root = Path(root)
    if "parts" not in leaf:
        full = read_leaf(root, leaf) if whole is None else whole
        if all(a == 0 and b == n for (a, b), n in zip(bounds, full.shape)):
            return full
        return np.array(full[tuple(slice(a, b) for a, b in bounds)])
    axis, n = leaf["split_axis"], len(leaf["parts"])
    length = leaf["shape"][axis] // n
    start, stop = bounds[axis]
    pieces = []
    for k in range(start // length, -(-stop // length) if stop > start else start // length):
        piece = _read_part(root, leaf["parts"][k], leaf["dtype"], _part_shape(leaf))
        lo, hi = max(start, k * length) - k * length, min(stop, (k + 1) * length) - k * length
        sl = [slice(a, b) for a, b in bounds]
        sl[axis] = slice(lo, hi)
        whole_part = all(s.start == 0 and s.stop == n for s, n in zip(sl, piece.shape))
        pieces.append(piece if whole_part else np.array(piece[tuple(sl)]))
        del piece
    if not pieces:  # an empty block
        shape = [b - a for a, b in bounds]
        return np.empty(shape, np_dtype(leaf["dtype"]))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=axis)


def load_leaf_sharded(root: str | os.PathLike, leaf: Mapping[str, Any], sharding: Any) -> Any:
    """A global ``jax.Array`` for one manifest leaf with ``sharding``, built from the
    blocks this process's devices hold: each distinct block is read once (from the
    overlapping parts only, for a split leaf), put on every local device that holds
    it, and dropped before the next. Peak host memory: one block (split leaf) or
    one whole leaf (unsplit leaf), never the model."""
    import jax  # as load_checkpoint

    shape = tuple(leaf["shape"])
    groups: dict[tuple, list] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        groups.setdefault(_normalize_index(index, shape), []).append(device)
    whole = read_leaf(root, leaf) if "parts" not in leaf and len(groups) > 1 else None
    arrays = []
    for bounds, devices in groups.items():
        host = read_leaf_slice(root, leaf, bounds, whole)
        for device in devices:
            # may_alias=False: a CPU "device" would otherwise keep the staging buffer
            # (and, through a view, a whole unsplit leaf) alive as its storage.
            arrays.append(jax.device_put(host, device, may_alias=False))
        jax.block_until_ready(arrays[-len(devices):])
        del host
    del whole
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def native_leaves(checkpoint: str | os.PathLike, dtype: str | None = None
                  ) -> tuple[dict, Iterator[tuple[tuple[str, ...], np.ndarray]]]:
    """(manifest, lazy iterator of (key path, host array)) of a native checkpoint,
    verified leaf by leaf; ``dtype`` casts floating leaves."""
    src = Path(checkpoint)
    m = checked_manifest(src)
    target = None if dtype is None else np_dtype(dtype)

    def leaves() -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
        for e in m["leaves"]:
            value = read_leaf(src, e)
            if target is not None and value.dtype != target:
                value = value.astype(np.float32).astype(target)
            yield tuple(e["path"]), value
            del value

    return m, leaves()
