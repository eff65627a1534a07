"""Bounded readers for files this backend does not trust.

Everything here checks sizes *before* it allocates: a file is measured with
``fstat`` before it is read, a zstd frame's declared content size is compared
with the expected size before a buffer is made, msgpack is unpacked with
length limits, refuses every ext type and has its nesting depth bounded, and a
safetensors header is validated completely (offsets, dtypes, shapes) before any
tensor is touched. Failures raise ``star_engine.errors.IntegrityError`` naming
the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

try:
    import resource  # Unix only: absent elsewhere, where there is no limit to read
except ImportError:  # pragma: no cover
    resource = None  # type: ignore[assignment]

import msgpack
import numpy as np
import zstandard

from star_engine import IntegrityError

CHUNK = 1 << 22  # 4 MiB streaming chunks
MAX_BUFFER = 16 << 30  # the most one buffer read from a file may be (GPT-J-6B's largest leaf: 0.8 GiB in fp32)
MAX_WINDOW = 1 << 27  # zstd's default decoder limit (ZSTD_WINDOWLOG_LIMIT_DEFAULT); our writer uses 2 MiB


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """What the cgroup (v2) this process runs in still allows, when it sets a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def _rlimit_available() -> int | None:
    """Room left under RLIMIT_AS / RLIMIT_DATA (a soft limit set on this process)."""
    if resource is None:
        return None
    try:
        with open("/proc/self/status", "rb") as f:
            status = {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(b":") for line in f)
                      if k in (b"VmSize", b"VmData")}
    except (ImportError, OSError, ValueError, IndexError):
        return None
    room = []
    for limit, used in ((resource.RLIMIT_AS, b"VmSize"), (resource.RLIMIT_DATA, b"VmData")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and used in status:
            room.append(soft - status[used])
    return min(room) if room else None


def memory_available() -> int | None:
    """Bytes this process can still allocate: the least of the machine's available memory,
    its cgroup's limit and its own address-space limits (None when none is known)."""
    known = [x for x in (_meminfo_available(), _cgroup_available(), _rlimit_available()) if x is not None]
    return max(0, min(known)) if known else None


def check_alloc(nbytes: int, what: str) -> None:
    """Refuse (IntegrityError naming ``what``) to allocate ``nbytes`` that a file declared when
    they exceed ``MAX_BUFFER`` or the memory actually available: checked before allocating."""
    if nbytes > MAX_BUFFER:
        raise IntegrityError(f"{what}: declares {nbytes} bytes, more than the limit of {MAX_BUFFER} for one buffer")
    available = memory_available()
    if available is not None and nbytes > available:
        raise IntegrityError(f"{what}: needs {nbytes} bytes, more than the {available} bytes of memory available")


def make_parents(dest: Path) -> list[Path]:
    """Create the missing folders above ``dest``; returns them, deepest first, so that a
    writer that fails can take them away again (``remove_created``)."""
    created, parent = [], dest.parent
    while not (parent.exists() or parent.is_symlink()):
        created.append(parent)
        parent = parent.parent
    dest.parent.mkdir(parents=True, exist_ok=True)
    return created


def remove_created(folders: list[Path]) -> None:
    """Remove the folders ``make_parents`` created, deepest first, where still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def read_bounded(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The whole file, refused (before reading) when it is larger than ``max_bytes``."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise IntegrityError(f"{p}: {size} bytes, more than the limit of {max_bytes}")
            data = f.read(size + 1)  # read(n) preallocates n bytes: ask only for what is there
    except FileNotFoundError:
        raise IntegrityError(f"{p}: missing") from None
    except OSError as exc:  # e.g. a file where a checkpoint folder was expected
        raise IntegrityError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(data) != size:
        raise IntegrityError(f"{p}: changed size while being read")
    return data



def read_json(path: str | os.PathLike, max_bytes: int, *, error: type[Exception] = IntegrityError) -> Any:
    """The JSON value of a file of at most ``max_bytes`` (``read_bounded``); ``error`` (naming the
    file) when it is not UTF-8, not JSON, nested too deep or holds a huge integer."""
    try:
        return json.loads(read_bounded(path, max_bytes))
    except (ValueError, RecursionError) as exc:
        raise error(f"{Path(path)}: not valid JSON ({type(exc).__name__}: {exc})") from None


# ----------------------------------------------------------------------------- msgpack


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


def _check_depth(obj: Any, max_depth: int) -> None:
    """Bounded nesting, and no ext values: msgpack decodes ext type -1 (Timestamp)
    itself, without asking ``ext_hook``, so it is refused here."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, msgpack.Timestamp):
            raise ValueError("ext type -1 (Timestamp) is not allowed")
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise ValueError(f"nesting deeper than {max_depth}")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def unpack_msgpack(data: bytes, *, what: str, max_depth: int = 16, max_items: int = 1 << 20) -> Any:
    """One msgpack object from ``data``: no ext types, string map keys, bounded
    lengths and nesting, no trailing bytes. ``what`` names the source in errors."""
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext,
        max_buffer_size=max(len(data), 1), max_str_len=len(data), max_bin_len=len(data),
        max_array_len=max_items, max_map_len=max_items, max_ext_len=len(data),
    )
    try:
        unpacker.feed(data)
        obj = unpacker.unpack()
        _check_depth(obj, max_depth)
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.OutOfData) as exc:
        raise IntegrityError(f"{what}: not a valid manifest ({type(exc).__name__}: {exc})") from None
    except RecursionError:
        raise IntegrityError(f"{what}: nesting too deep") from None
    if unpacker.tell() != len(data):
        raise IntegrityError(f"{what}: {len(data) - unpacker.tell()} trailing bytes after the manifest")
    return obj


# ----------------------------------------------------------------------------- zstd


def read_zstd_part(path: str | os.PathLike, *, compressed_bytes: int, raw_bytes: int, sha256: str) -> np.ndarray:
    """Decompress one part into a fresh uint8 array of exactly ``raw_bytes``.

    Refused before allocation when the file's size differs from
    ``compressed_bytes`` or the zstd frame does not declare ``raw_bytes`` as its
    content size; decompression streams into the preallocated buffer and fails
    if the frame yields more or less than that, or if the sha256 differs.
    """
    p = Path(path)
    try:
        f = open(p, "rb")
    except FileNotFoundError:
        raise IntegrityError(f"{p}: part file missing") from None
    except OSError as exc:
        raise IntegrityError(f"{p}: cannot read ({exc.strerror or exc})") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != compressed_bytes:
            raise IntegrityError(f"{p}: {size} bytes on disk, manifest says {compressed_bytes} (truncated or replaced)")
        head = f.read(18)  # the largest zstd frame header
        try:
            params = zstandard.get_frame_parameters(head)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{p}: not a zstd frame ({exc})") from None
        if params.content_size != raw_bytes:
            declared = "unknown" if params.content_size == zstandard.CONTENTSIZE_UNKNOWN else params.content_size
            raise IntegrityError(f"{p}: zstd frame declares {declared} bytes, manifest says {raw_bytes}")
        window = min(params.window_size or raw_bytes, raw_bytes)  # a one-segment frame's is its content
        if window > MAX_WINDOW:
            raise IntegrityError(f"{p}: zstd frame needs a window of {window} bytes, more than the decoder's limit "
                                 f"of {MAX_WINDOW}")
        f.seek(0)
        check_alloc(raw_bytes + window, str(p))  # the output buffer and the decoder's window
        out = np.empty(raw_bytes, dtype=np.uint8)
        view = memoryview(cast(Any, out))  # numpy's stubs declare __buffer__ only for 3.12+
        h = hashlib.sha256()
        pos = 0
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=CHUNK, read_across_frames=False,
                                                                 closefd=False)
            with reader:
                while pos < raw_bytes:
                    n = reader.readinto(view[pos:min(raw_bytes, pos + CHUNK)])
                    if n == 0:
                        raise IntegrityError(f"{p}: zstd stream ended after {pos} of {raw_bytes} bytes")
                    h.update(view[pos:pos + n])
                    pos += n
                if reader.read(1):
                    raise IntegrityError(f"{p}: zstd stream yields more than {raw_bytes} bytes")
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{p}: corrupt zstd data ({exc})") from None
    if h.hexdigest() != sha256:
        raise IntegrityError(f"{p}: sha256 {h.hexdigest()} does not match the manifest's {sha256}")
    return out


def write_zstd_part(path: str | os.PathLike, raw: memoryview, *, level: int = 3) -> tuple[int, str]:
    """Write ``raw`` as one zstd frame that declares its content size; fsync.
    Returns (compressed size, sha256 of the raw bytes)."""
    h = hashlib.sha256()
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True, threads=0)
    with open(path, "wb") as f:
        with cctx.stream_writer(f, size=len(raw), closefd=False) as writer:
            for start in range(0, len(raw), CHUNK):
                chunk = raw[start:start + CHUNK]
                h.update(chunk)
                writer.write(chunk)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    return size, h.hexdigest()


# ----------------------------------------------------------------------------- safetensors

SAFETENSORS_DTYPES: dict[str, str] = {  # safetensors name -> numpy/ml_dtypes name
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
SAFETENSORS_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # numpy/ml_dtypes name
    shape: tuple[int, ...]
    start: int  # absolute file offsets
    end: int


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # 0.16 s, paid only when a bfloat16 file is read

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Validate a safetensors file's header against the file and return its
    tensors and metadata. Checks: header length within the file, valid JSON
    object, known dtypes, integer shapes, ``dtype x shape == byte length``,
    offsets within the data section, no overlaps and no gaps."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise IntegrityError(f"{p}: {size} bytes, too short for a safetensors file")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8 or n > SAFETENSORS_MAX_HEADER:
                raise IntegrityError(f"{p}: safetensors header length {n} exceeds the file ({size} bytes) or limit")
            raw = f.read(n)
    except OSError as exc:
        raise IntegrityError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw) != n:
        raise IntegrityError(f"{p}: changed size while being read")
    try:
        header = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, an integer of more than 4300 digits
        raise IntegrityError(f"{p}: safetensors header is not valid JSON ({exc})") from None
    except RecursionError:
        raise IntegrityError(f"{p}: safetensors header nests too deeply") from None
    if not isinstance(header, dict):
        raise IntegrityError(f"{p}: safetensors header is not a JSON object")
    base, data_len = 8 + n, size - 8 - n
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise IntegrityError(f"{p}: safetensors __metadata__ must map strings to strings")
    tensors: dict[str, TensorInfo] = {}
    for name, info in header.items():
        where = f"{p}: tensor {name!r}"
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise IntegrityError(f"{where}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise IntegrityError(f"{where}: unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise IntegrityError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_len):
            raise IntegrityError(f"{where}: data_offsets {offsets!r} outside the data section ({data_len} bytes)")
        np_name = SAFETENSORS_DTYPES[dtype]
        expected = math.prod(shape) * np_dtype(np_name).itemsize
        if offsets[1] - offsets[0] != expected:
            raise IntegrityError(f"{where}: {dtype} x {shape} needs {expected} bytes, "
                                 f"data_offsets span {offsets[1] - offsets[0]}")
        tensors[name] = TensorInfo(name, np_name, tuple(shape), base + offsets[0], base + offsets[1])
    pos = base
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if t.start < pos:
            raise IntegrityError(f"{p}: tensor {t.name!r} overlaps the previous tensor")
        if t.start > pos:
            raise IntegrityError(f"{p}: {t.start - pos} unaccounted bytes before tensor {t.name!r}")
        pos = t.end
    if pos != size:
        raise IntegrityError(f"{p}: {size - pos} trailing bytes after the last tensor")
    return tensors, metadata
