"""Import mesh-transformer-jax slim checkpoints (the layout: ``mtj_layout.py``)
into native checkpoints.

Nothing is unpickled: each ``.npz`` is opened with ``zipfile``; every member's
``.npy`` header is parsed with ``numpy.lib.format`` (object dtypes refused), and
all names, dtypes and shapes of every shard are checked against the model
config before a single array is allocated. Leaves are then assembled one at a
time (peak host memory: about three times the largest leaf, e.g. 1.2 GB for
GPT-J-6B's embedding in fp32, against 12 GB for the bf16 model).
"""

from __future__ import annotations

import os
import re
import struct
import typing
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

import tokenize

import numpy as np
from numpy.lib import format as npy_format

from star_engine import IntegrityError, UserError

from ..model.config import GPTJConfig
from ..checkpoint.format import param_specs
from ..checkpoint.write import write_checkpoint
from .mtj_layout import MtjLeaf, leaf_layout
from ..checkpoint.safeio import check_alloc, np_dtype

_MEMBER_RE = re.compile(r"^arr_([0-9]{1,6})\.npy$")
_PIECE_RE = re.compile(r"^([0-9]{1,4})\.npz$")
_SHARD_RE = re.compile(r"^shard_([0-9]{1,4})$")
MAX_SHARDS = 256
MAX_HEADER = 10_000
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Member:
    zip_path: Path
    name: str
    dtype: np.dtype  # as stored (V2 for bf16)
    shape: tuple[int, ...]
    fortran: bool


def _read_header(f, where: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    try:
        version = npy_format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(f, max_header_size=MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy_format.read_array_header_2_0(f, max_header_size=MAX_HEADER)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, SyntaxError, EOFError, tokenize.TokenError) as exc:  # numpy tokenizes the header
        raise IntegrityError(f"{where}: not a valid .npy header ({exc})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise IntegrityError(f"{where}: dtype {dtype} is not a plain numeric type (pickles are never loaded)")
    return dtype, tuple(int(d) for d in shape), bool(fortran)


def _stored_kind(dtype: np.dtype) -> str | None:
    """The logical dtype name of a stored array (V2 = bf16), None when not allowed."""
    if dtype.kind == "V" and dtype.itemsize == 2:
        return "bfloat16"
    if dtype.byteorder == ">":
        return None
    if dtype.kind == "f" and dtype.itemsize in (2, 4):
        return dtype.name
    if dtype.kind in "iu":
        return "int"
    return None


def _scan_zip(zip_path: Path) -> list[Member]:
    """Headers of every member of one .npz, in arr_N order, without reading data."""
    try:
        zf = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, OverflowError, NotImplementedError) as exc:
        raise IntegrityError(f"{zip_path}: not a readable zip/npz file ({exc})") from None
    out: dict[int, Member] = {}
    with zf:
        infos = zf.infolist()
        if len(infos) > 100_000:
            raise IntegrityError(f"{zip_path}: {len(infos)} members, too many")
        for info in infos:
            m = _MEMBER_RE.match(info.filename)
            if not m:
                raise IntegrityError(f"{zip_path}: unexpected member {info.filename!r} (expected arr_N.npy)")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise IntegrityError(f"{zip_path}: member {info.filename} uses compression {info.compress_type}")
            where = f"{zip_path}:{info.filename}"
            try:
                with zf.open(info) as f:
                    dtype, shape, fortran = _read_header(f, where)
                    offset = f.tell()
            except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError, OSError, ValueError,
                    struct.error, OverflowError) as exc:
                raise IntegrityError(f"{where}: corrupt member ({type(exc).__name__}: {exc})") from None
            if any(d < 0 for d in shape) or len(shape) > 4:
                raise IntegrityError(f"{where}: bad shape {shape}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if info.file_size != offset + nbytes:  # declared size bounds the decompression, too
                raise IntegrityError(f"{where}: {info.file_size} bytes, the header implies {offset + nbytes}")
            out[int(m.group(1))] = Member(zip_path, info.filename, dtype, shape, fortran)
    if sorted(out) != list(range(len(out))):
        raise IntegrityError(f"{zip_path}: members are not arr_0 … arr_{len(out) - 1}")
    return [out[i] for i in range(len(out))]


def _shard_dirs(src: Path) -> list[Path]:
    if not src.is_dir():
        raise UserError(f"{src}: no such folder")
    found = {}
    for p in src.iterdir():
        m = _SHARD_RE.match(p.name)
        if m and p.is_dir():
            found[int(m.group(1))] = p
    if not found:
        pickles = sorted(p.name for p in src.iterdir() if p.suffix in (".pkl", ".pickle", ".pt", ".bin"))
        if pickles:
            raise UserError(f"{src / pickles[0]}: pickle-based files are never loaded; "
                            "a slim checkpoint is shard_*/N.npz")
        raise UserError(f"{src}: no shard_0 … folders (a mesh-transformer-jax slim checkpoint)")
    if sorted(found) != list(range(len(found))) or len(found) > MAX_SHARDS:
        raise IntegrityError(f"{src}: shard folders must be shard_0 … shard_{len(found) - 1}")
    return [found[i] for i in range(len(found))]


def plan_mtj(src: str | os.PathLike, config: GPTJConfig) -> tuple[list[MtjLeaf], list[list[Member]]]:
    """Validate a slim checkpoint completely (layout, every header against the
    config) without reading any array. Returns (leaves, members[shard][leaf])."""
    src = Path(src)
    shards = _shard_dirs(src)
    layout = leaf_layout(config, len(shards))
    members: list[list[Member]] = []
    n_pieces = None
    for shard in shards:
        pieces = {}
        for p in shard.iterdir():
            m = _PIECE_RE.match(p.name)
            if m:
                pieces[int(m.group(1))] = p
            elif p.suffix in (".pkl", ".pickle", ".pt", ".bin"):
                raise UserError(f"{p}: pickle-based files are never loaded")
        if sorted(pieces) != list(range(len(pieces))) or not pieces:
            raise IntegrityError(f"{shard}: expected 0.npz … N.npz")
        if n_pieces is None:
            n_pieces = len(pieces)
        elif len(pieces) != n_pieces:
            raise IntegrityError(f"{shard}: {len(pieces)} files, shard_0 has {n_pieces}")
        flat = [mem for i in range(len(pieces)) for mem in _scan_zip(pieces[i])]
        if len(flat) != len(layout):
            hint = (" (a full checkpoint with optimizer state? slim it first)" if len(flat) > len(layout) else "")
            raise UserError(f"{shard}: {len(flat)} arrays, a {config.n_layer}-layer GPT-J slim checkpoint has "
                            f"{len(layout)}{hint}")
        for i, (leaf, mem) in enumerate(zip(layout, flat)):
            kind = _stored_kind(mem.dtype)
            where = f"{mem.zip_path}:{mem.name} ({leaf.name})"
            if leaf.native is None:
                if kind != "int" or mem.shape != ():
                    raise UserError(f"{where}: the step must be an integer scalar, got {mem.dtype}{list(mem.shape)}")
                continue
            if kind not in FLOAT_DTYPES:
                raise UserError(f"{where}: dtype {mem.dtype} is not bf16 (V2), float16 or float32")
            if members and _stored_kind(members[0][i].dtype) != kind:
                raise UserError(f"{where}: dtype {kind} differs from shard_0's")
            if mem.shape != leaf.shard_shape:
                raise UserError(f"{where}: shape {list(mem.shape)}, the model config implies "
                                f"{list(leaf.shard_shape)} per shard ({len(shards)} shards)")
        members.append(flat)
    return layout, members


def _read_member(mem: Member) -> np.ndarray:
    """The array of one member (header re-checked), as its logical dtype. A member whose data
    is damaged (a bad CRC, broken deflate data, cut short) is an IntegrityError naming the
    .npz file and the member."""
    where = f"{mem.zip_path}:{mem.name}"
    try:
        with zipfile.ZipFile(mem.zip_path) as zf, zf.open(mem.name) as f:
            dtype, shape, fortran = _read_header(f, where)
            if (dtype, shape, fortran) != (mem.dtype, mem.shape, mem.fortran):
                raise IntegrityError(f"{where}: changed since it was checked")
            stored_shape = shape[::-1] if fortran else shape
            check_alloc(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, where)
            buf = np.empty(stored_shape, dtype)
            view = memoryview(typing.cast(typing.Any, buf.reshape(-1).view(np.uint8)))  # numpy stubs: 3.12+ only
            pos = 0
            while pos < len(view):
                n = typing.cast(typing.Any, f).readinto(view[pos:pos + (1 << 24)])  # a ZipExtFile, typed IO[bytes]
                if not n:
                    raise IntegrityError(f"{where}: data ends after {pos} of {len(view)} bytes")
                pos += n
            if f.read(1):
                raise IntegrityError(f"{where}: more data than its header declares")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, KeyError, ValueError, OSError,
            RuntimeError, NotImplementedError, struct.error, OverflowError) as exc:
        raise IntegrityError(f"{where}: corrupt member data ({type(exc).__name__}: {exc})") from None
    if fortran:
        buf = buf.T
    kind = _stored_kind(dtype)
    if kind == "bfloat16":
        buf = buf.view(np_dtype("bfloat16"))
    elif dtype.byteorder not in ("=", "|", "<"):
        buf = buf.astype(dtype.newbyteorder("<"))
    return buf


def _combine(leaf: MtjLeaf, shard_members: list[Member]) -> np.ndarray:
    """One leaf from all shards in its stored dtype (sums in fp32)."""
    how = leaf.how
    if how[0] == "first":
        return _read_member(shard_members[0])
    if how[0] == "sum":
        total = _read_member(shard_members[0])
        for mem in shard_members[1:]:
            x = _read_member(mem)
            if np.any(x):  # skip exact zeros, so a round trip keeps -0.0 bit for bit
                total = total.astype(np.float32) + x.astype(np.float32)
        return total
    axis = how[1]
    first: np.ndarray | None
    first = _read_member(shard_members[0])
    check_alloc(int(np.prod(leaf.full_shape, dtype=np.int64)) * first.dtype.itemsize,
                f"{shard_members[0].zip_path}:{shard_members[0].name} ({leaf.name})")
    out = np.empty(leaf.full_shape, first.dtype)
    size = first.shape[axis]
    for k, mem in enumerate(shard_members):
        index = [slice(None)] * out.ndim
        index[axis] = slice(k * size, (k + 1) * size)
        out[tuple(index)] = first if k == 0 else _read_member(mem)
        first = None
    return out


def iter_mtj_gptj(src: str | os.PathLike, config: GPTJConfig
                  ) -> tuple[int, Iterator[tuple[tuple[str, ...], np.ndarray]]]:
    """(checkpoint step, lazy iterator of (native key path, array in config.dtype))
    in this backend's sorted parameter order. Everything is validated first."""
    layout, members = plan_mtj(src, config)
    by_native: dict[tuple[str, ...], int] = {}
    i: int | None
    for i, leaf in enumerate(layout):
        if leaf.native is not None:
            by_native[leaf.native] = i
    specs = param_specs(config.to_dict())
    for key_path, (shape, _) in specs.items():
        i = by_native.get(key_path)
        if i is None or layout[i].full_shape != shape:
            raise UserError(f"mtj: parameter {'/'.join(key_path)} has no matching leaf")  # a bug guard
    step = int(_read_member(members[0][-1]))
    target = np_dtype(config.dtype)

    def cast(x: np.ndarray) -> np.ndarray:
        if x.dtype == target:
            return x
        return np.ascontiguousarray(x.astype(np.float32, copy=False).astype(target))

    def leaves() -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
        for key_path in sorted(specs):
            i = by_native[key_path]
            value = _combine(layout[i], [m[i] for m in members])
            if key_path == ("wte", "embeddings"):
                j = by_native[("wte", "bias")]
                bias = _combine(layout[j], [m[j] for m in members])
                if np.any(bias):
                    value = value.astype(np.float32)
                    value += bias.astype(np.float32)[None, :]
                del bias
            yield key_path, cast(value)
            del value

    return step, leaves()


def convert_mtj_gptj(src: str | os.PathLike, dest: str | os.PathLike, *, config: GPTJConfig, tokenizer: dict,
                     extra: dict | None = None, mp_split: int = 1) -> dict:
    """Convert a slim checkpoint into a native checkpoint, one leaf in memory at a time."""
    step, leaves = iter_mtj_gptj(src, config)
    info = {"source": "mtj_slim", "mtj_step": step, **(extra or {})}
    return write_checkpoint(dest, leaves, model_config=config.to_dict(), tokenizer=tokenizer, extra=info,
                            mp_split=mp_split)
