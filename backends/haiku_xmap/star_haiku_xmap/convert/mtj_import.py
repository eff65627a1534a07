"""mesh-transformer-jax slim checkpoints: import into native checkpoints, and export.

A slim checkpoint (what mesh-transformer-jax's ``slim_model.py`` writes and its
``read_ckpt`` reads) is a folder ``shard_0 … shard_{n-1}``, one per model-parallel
shard, each holding ``0.npz … 15.npz``. Flattening the ``{"params", "step"}``
pytree in sorted-key order gives a list of leaves; every shard stores its own
slice of each leaf, and that list is cut into 16 contiguous pieces, one per
file, as ``arr_0.npy, arr_1.npy, …``. bf16 arrays carry numpy dtype ``V2``.

Leaf names (haiku module paths under ``causal_transformer_shard/~/``; modules are
numbered in the order mesh-transformer-jax builds them, so a layer's q, v, k are
``linear``, ``linear_1``, ``linear_2``), per-shard shapes for n shards, and how
the shards combine into this backend's parameters::

    embedding_shard/~/linear        b (D,) summed, folded into wte    w (V/n, D) -> wte rows
    layer_i/~/linear                w (D, D/n) -> h_i/attn/q/w, concatenated on the output dim
    layer_i/~/linear_1              w (D, D/n) -> h_i/attn/v/w
    layer_i/~/linear_2              w (D, D/n) -> h_i/attn/k/w
    layer_i/~/linear_3              w (D/n, D) -> h_i/attn/out/w, concatenated on the input dim
    layer_i/~/linear_4              b (4D/n,), w (D, 4D/n) -> h_i/mlp/fc_in/{b, w}
    layer_i/~/linear_5              b (D,) summed, w (4D/n, D) -> h_i/mlp/fc_out/{b, w}
    layer_i/~/replicated_layer_norm offset, scale (D,): shard 0 -> h_i/ln
    projection_shard/~/linear       b (V/n,), w (D, V/n) -> lm_head/{b, w}
    projection_shard/~/replicated_layer_norm  offset, scale (D,): shard 0 -> ln_f
    step                            () an integer, recorded in the checkpoint's extra

Both frameworks store weights as (in, out), so nothing is transposed. The
embedding bias exists because mesh-transformer-jax embeds with a one-hot matmul
that has a bias; every token gets the sum of the shards' biases added, which is
what folding it into every row of ``wte`` reproduces (as Hugging Face's
conversion does). fc_out's bias is added by every shard before the cross-shard
sum, hence summed too.

Nothing is unpickled: each ``.npz`` is opened with ``zipfile``; every member's
``.npy`` header is parsed with ``numpy.lib.format`` (object dtypes refused), and
all names, dtypes and shapes of every shard are checked against the model
config before a single array is allocated. Leaves are then assembled one at a
time (peak host memory: about three times the largest leaf, e.g. 1.2 GB for
GPT-J-6B's embedding in fp32, against 12 GB for the bf16 model).

``export_mtj`` writes the same layout from a native checkpoint, one leaf at a
time: embedding bias zero (already folded into ``wte``), fc_out's bias on shard
0 and zero elsewhere, so that importing the export gives back the native
parameters bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import tokenize

import numpy as np
from numpy.lib import format as npy_format

from star_engine.errors import IntegrityError, UserError
from star_engine.fsio import temporary_sibling

from ..config import PRESETS, GPTJConfig
from .safeio import check_alloc, make_parents, np_dtype, read_bounded, remove_created

PREFIX = "causal_transformer_shard/~/"
PIECES = 16  # files per shard mesh-transformer-jax writes
_MEMBER_RE = re.compile(r"^arr_([0-9]{1,6})\.npy$")
_PIECE_RE = re.compile(r"^([0-9]{1,4})\.npz$")
_SHARD_RE = re.compile(r"^shard_([0-9]{1,4})$")
MAX_SHARDS = 256
MAX_HEADER = 10_000
FLOAT_DTYPES = ("bfloat16", "float16", "float32")

# The 10 leaves of one layer: (mtj module, name) -> (native module, name, how)
# how: ("cat", axis) concatenate shards on axis; ("sum",) add the shards; ("first",) shard 0.
_LAYER = {
    ("linear", "w"): ("attn/q", "w", ("cat", 1)),
    ("linear_1", "w"): ("attn/v", "w", ("cat", 1)),
    ("linear_2", "w"): ("attn/k", "w", ("cat", 1)),
    ("linear_3", "w"): ("attn/out", "w", ("cat", 0)),
    ("linear_4", "b"): ("mlp/fc_in", "b", ("cat", 0)),
    ("linear_4", "w"): ("mlp/fc_in", "w", ("cat", 1)),
    ("linear_5", "b"): ("mlp/fc_out", "b", ("sum",)),
    ("linear_5", "w"): ("mlp/fc_out", "w", ("cat", 0)),
    ("replicated_layer_norm", "offset"): ("ln", "offset", ("first",)),
    ("replicated_layer_norm", "scale"): ("ln", "scale", ("first",)),
}
_TOP = {
    ("embedding_shard/~/linear", "b"): ("wte", "bias", ("sum",)),  # folded into wte/embeddings
    ("embedding_shard/~/linear", "w"): ("wte", "embeddings", ("cat", 0)),
    ("projection_shard/~/linear", "b"): ("lm_head", "b", ("cat", 0)),
    ("projection_shard/~/linear", "w"): ("lm_head", "w", ("cat", 1)),
    ("projection_shard/~/replicated_layer_norm", "offset"): ("ln_f", "offset", ("first",)),
    ("projection_shard/~/replicated_layer_norm", "scale"): ("ln_f", "scale", ("first",)),
}


@dataclass(frozen=True)
class MtjLeaf:
    name: str  # "params/causal_transformer_shard/~/layer_0/~/linear/w" or "step"
    native: tuple[str, ...] | None  # (module, name) of this backend's parameter; None for step
    how: tuple
    full_shape: tuple[int, ...]  # the combined (native) shape
    shard_shape: tuple[int, ...]  # what each shard stores


@dataclass(frozen=True)
class Member:
    zip_path: Path
    name: str
    dtype: np.dtype  # as stored (V2 for bf16)
    shape: tuple[int, ...]
    fortran: bool


# ----------------------------------------------------------------------------- layout


def check_config(config: GPTJConfig, shards: int) -> None:
    """Refuse configs a mesh-transformer-jax GPT-J cannot have (UserError)."""
    c = config
    if c.n_head * c.d_head != c.d_model:
        raise UserError(f"mtj: n_head x d_head = {c.n_head * c.d_head} must equal d_model {c.d_model}")
    if c.d_ff != 4 * c.d_model:
        raise UserError(f"mtj: d_ff {c.d_ff} must be 4 x d_model = {4 * c.d_model}")
    for what, value in (("vocab", c.vocab), ("n_head", c.n_head), ("d_model", c.d_model)):
        if value % shards:
            raise UserError(f"mtj: {what} {value} is not divisible by {shards} shards")


def leaf_layout(config: GPTJConfig, shards: int) -> list[MtjLeaf]:
    """Every leaf of a slim checkpoint in file order (sorted keys), with shapes."""
    check_config(config, shards)
    c, n = config, shards
    D, F, V = c.d_model, c.d_ff, c.vocab
    shard_shapes = {
        ("linear", "w"): (D, D // n), ("linear_1", "w"): (D, D // n), ("linear_2", "w"): (D, D // n),
        ("linear_3", "w"): (D // n, D), ("linear_4", "b"): (F // n,), ("linear_4", "w"): (D, F // n),
        ("linear_5", "b"): (D,), ("linear_5", "w"): (F // n, D),
        ("replicated_layer_norm", "offset"): (D,), ("replicated_layer_norm", "scale"): (D,),
        ("embedding_shard/~/linear", "b"): (D,), ("embedding_shard/~/linear", "w"): (V // n, D),
        ("projection_shard/~/linear", "b"): (V // n,), ("projection_shard/~/linear", "w"): (D, V // n),
        ("projection_shard/~/replicated_layer_norm", "offset"): (D,),
        ("projection_shard/~/replicated_layer_norm", "scale"): (D,),
    }

    def full(shape: tuple[int, ...], how: tuple) -> tuple[int, ...]:
        if how[0] != "cat":
            return shape
        out = list(shape)
        out[how[1]] *= n
        return tuple(out)

    entries: list[tuple[str, str, MtjLeaf]] = []
    for (module, name), (nat_mod, nat_name, how) in _TOP.items():
        shp = shard_shapes[(module, name)]
        entries.append((PREFIX + module, name, MtjLeaf(f"params/{PREFIX}{module}/{name}", (nat_mod, nat_name), how,
                                                       full(shp, how), shp)))
    for i in range(c.n_layer):
        for (module, name), (nat_mod, nat_name, how) in _LAYER.items():
            shp = shard_shapes[(module, name)]
            mod = f"{PREFIX}layer_{i}/~/{module}"
            entries.append((mod, name, MtjLeaf(f"params/{mod}/{name}", (f"h_{i}/{nat_mod}", nat_name), how,
                                               full(shp, how), shp)))
    entries.sort(key=lambda e: (e[0], e[1]))  # jax flattens dicts in sorted-key order, level by level
    return [e[2] for e in entries] + [MtjLeaf("step", None, ("step",), (), ())]


def piece_sizes(n_leaves: int, pieces: int = PIECES) -> list[int]:
    """How many leaves each of the ``pieces`` files holds (contiguous, balanced)."""
    k, m = divmod(n_leaves, pieces)
    return [k + (1 if i < m else 0) for i in range(pieces)]


def config_from_file(path: str | os.PathLike, *, dtype: str = "bfloat16") -> GPTJConfig:
    """A GPTJConfig from a JSON file: mesh-transformer-jax's own config (``layers``,
    ``d_model``, ``n_heads``, ``n_vocab``, ``pe_rotary_dims``, ``seq``) or this
    backend's field names."""
    p = Path(path)
    try:
        d = json.loads(read_bounded(p, 1 << 20))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep, a huge integer
        raise UserError(f"{p}: not valid JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(d, dict):
        raise UserError(f"{p}: not a JSON object")
    try:
        if "layers" in d:
            if d.get("pe", "rotary") != "rotary" or d.get("norm", "layernorm") != "layernorm":
                raise UserError(f"{p}: only pe = 'rotary' and norm = 'layernorm' (GPT-J) can be imported")
            D, H = d["d_model"], d["n_heads"]
            if type(D) is not int or type(H) is not int or H <= 0:
                raise UserError(f"{p}: d_model and n_heads must be positive integers, got {D!r} and {H!r}")
            return GPTJConfig(n_layer=d["layers"], d_model=D, n_head=H, d_head=D // H, d_ff=4 * D,
                              rotary_dim=d["pe_rotary_dims"], n_ctx=d["seq"], vocab=d["n_vocab"], dtype=dtype)
        return GPTJConfig.from_dict({**d, "dtype": dtype})
    except KeyError as exc:
        raise UserError(f"{p}: missing key {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{p}: {exc}") from None


def resolve_config(spec: str, *, dtype: str = "bfloat16") -> GPTJConfig:
    """A preset name (``gptj-6b``) or a JSON config file."""
    if spec in PRESETS:
        return PRESETS[spec].replace(dtype=dtype)
    if Path(spec).is_file():
        return config_from_file(spec, dtype=dtype)
    raise UserError(f"--config: {spec!r} is neither a preset ({sorted(PRESETS)}) nor a JSON file")


# ----------------------------------------------------------------------------- reading


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
            view = memoryview(buf.reshape(-1).view(np.uint8))
            pos = 0
            while pos < len(view):
                n = f.readinto(view[pos:pos + (1 << 24)])
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
    from .checkpoint import param_specs

    layout, members = plan_mtj(src, config)
    by_native: dict[tuple[str, ...], int] = {}
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
    from .checkpoint import write_checkpoint

    step, leaves = iter_mtj_gptj(src, config)
    info = {"source": "mtj_slim", "mtj_step": step, **(extra or {})}
    return write_checkpoint(dest, leaves, model_config=config.to_dict(), tokenizer=tokenizer, extra=info,
                            mp_split=mp_split)


# ----------------------------------------------------------------------------- export


def _write_member(zf: zipfile.ZipFile, index: int, arr: np.ndarray) -> None:
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would turn the 0-d step into shape (1,))
    if arr.dtype == np_dtype("bfloat16"):
        arr = arr.view(np.dtype("V2"))  # how mesh-transformer-jax stores bf16
    with zf.open(f"arr_{index}.npy", "w", force_zip64=True) as f:
        npy_format.write_array(f, arr, allow_pickle=False)


def _shard_slices(leaf: MtjLeaf, value: np.ndarray, shards: int) -> list[np.ndarray]:
    how = leaf.how
    if how[0] == "cat":
        return np.split(value, shards, axis=how[1])
    if how[0] == "first":
        return [value] * shards
    zero = np.zeros_like(value)  # "sum": all of it on shard 0
    return [value] + [zero] * (shards - 1)


def export_mtj(checkpoint: str | os.PathLike, dest: str | os.PathLike, *, shards: int = 8,
               dtype: str | None = None, step: int = 0) -> None:
    """Write native checkpoint ``checkpoint`` as a mesh-transformer-jax slim
    checkpoint with ``shards`` model-parallel shards at ``dest`` (a new folder,
    written to a temporary sibling and renamed). One native leaf in memory at a time."""
    from .checkpoint import read_leaf, read_manifest, _check_against_config

    src = Path(checkpoint)
    m = read_manifest(src)
    _check_against_config(m, str(src))
    if m["model_config"].get("architecture", "gptj") != "gptj":
        raise UserError(f"{src}: --to mtj writes GPT-J only; this checkpoint is {m['model_config']['architecture']!r}")
    config = GPTJConfig.from_dict(m["model_config"])
    if dtype is not None:
        config = config.replace(dtype=dtype)
    layout = leaf_layout(config, shards)
    entries = {tuple(e["path"]): e for e in m["leaves"]}
    dest = Path(dest)
    if dest.exists():
        raise UserError(f"{dest}: exists; refusing to overwrite")
    created = make_parents(dest)  # taken away again if the export fails
    tmp = temporary_sibling(dest)
    tmp.mkdir()
    target = np_dtype(config.dtype)
    try:
        for s in range(shards):
            (tmp / f"shard_{s}").mkdir()
        start = 0
        for piece, count in enumerate(piece_sizes(len(layout))):
            zips = [zipfile.ZipFile(tmp / f"shard_{s}" / f"{piece}.npz", "w", zipfile.ZIP_STORED, allowZip64=True)
                    for s in range(shards)]
            try:
                for j, leaf in enumerate(layout[start:start + count]):
                    if leaf.native is None:
                        slices = [np.asarray(step, np.int32)] * shards
                    elif leaf.native == ("wte", "bias"):
                        slices = [np.zeros(leaf.shard_shape, target)] * shards
                    else:
                        value = read_leaf(src, entries[leaf.native])
                        if value.dtype != target:
                            value = value.astype(np.float32).astype(target)
                        slices = _shard_slices(leaf, value, shards)
                        del value
                    for zf, part in zip(zips, slices):
                        _write_member(zf, j, part)
                    del slices
            finally:
                for zf in zips:
                    zf.close()
            start += count
        for s in range(shards):
            for f in (tmp / f"shard_{s}").iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        os.rename(tmp, dest)
        created = []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_created(created)


def native_leaves(checkpoint: str | os.PathLike, dtype: str | None = None
                  ) -> tuple[dict, Iterator[tuple[tuple[str, ...], np.ndarray]]]:
    """(manifest, lazy iterator of (key path, host array)) of a native checkpoint,
    verified leaf by leaf; ``dtype`` casts floating leaves."""
    from .checkpoint import _check_against_config, read_leaf, read_manifest

    src = Path(checkpoint)
    m = read_manifest(src)
    _check_against_config(m, str(src))
    target = None if dtype is None else np_dtype(dtype)

    def leaves() -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
        for e in m["leaves"]:
            value = read_leaf(src, e)
            if target is not None and value.dtype != target:
                value = value.astype(np.float32).astype(target)
            yield tuple(e["path"]), value
            del value

    return m, leaves()


def params_to_mtj_arrays(params: Mapping[str, Any], config: GPTJConfig, shards: int) -> list[list[np.ndarray]]:
    """In-memory slim layout (arrays[shard][leaf]) of small params, for tests and tools."""
    layout = leaf_layout(config, shards)
    out: list[list[np.ndarray]] = [[] for _ in range(shards)]
    for leaf in layout:
        if leaf.native is None:
            slices = [np.asarray(0, np.int32)] * shards
        elif leaf.native == ("wte", "bias"):
            slices = [np.zeros(leaf.shard_shape, np.asarray(params["wte"]["embeddings"]).dtype)] * shards
        else:
            slices = _shard_slices(leaf, np.asarray(params[leaf.native[0]][leaf.native[1]]), shards)
        for s in range(shards):
            out[s].append(slices[s])
    return out
