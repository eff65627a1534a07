"""Hostile files against the backend's readers: nothing is unpickled, nothing is allocated from a
forged size, every refusal names the file.

The backend's own tests (backends/haiku_xmap/tests) already check: pickle weights refused by the
HF importer and ``inference.load_model``; a zstd frame declaring 1 GiB, or no size; a truncated
or bit-flipped part; a manifest with ext type 42, nesting of 40 and 100 000 lists, trailing
bytes, a 1 GiB size, a path-traversal part name; safetensors with a 2**40 header length,
non-JSON, overlapping, out-of-range, gapped, wrongly sized or unknown-dtype tensors; mtj slim
checkpoints with a pickled member, a wrong shape or dtype, a size lie or a stray member. The
cases here are the ones they do not have, and memory is bounded with a hard address-space
limit (``RLIMIT_AS``) in a child process, which catches native allocations (zstd, numpy) that
``tracemalloc`` does not see: a reader that tried to allocate a forged size would get a
MemoryError there instead of refusing the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import msgpack
import numpy as np
import pytest

from star_testkit import REPO
from star_engine.errors import IntegrityError
from star_haiku_xmap import inference
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.convert import hf_import
from star_haiku_xmap.checkpoint.safeio import SAFETENSORS_DTYPES, read_safetensors_header, unpack_msgpack

LINUX = sys.platform.startswith("linux")
FIXTURE = REPO / "backends" / "haiku_xmap" / "tests" / "fixtures" / "gptj_tiny"
CFG = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=64, rotary_dim=4, n_ctx=16, vocab=40)
TOK = {"kind": "byte", "vocab_size": 257, "eos_id": 256}


def bounded(setup: str, call: str, limit_mb: int = 96) -> str:
    """Run ``setup`` then ``call`` in a child whose address space may grow by ``limit_mb`` at
    most after ``setup``; returns "REFUSED <message>" (a UserError, IntegrityError included),
    "ACCEPTED", or "MEMORYERROR" (something tried to allocate more)."""
    script = "\n".join([
        "import resource",
        "from star_engine.errors import UserError",
        textwrap.dedent(setup).strip(),
        "size = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize:')) * 1024",
        f"resource.setrlimit(resource.RLIMIT_AS, (size + {limit_mb << 20}, size + {limit_mb << 20}))",
        "try:",
        textwrap.indent(textwrap.dedent(call).strip(), "    "),
        "    print('ACCEPTED')",
        "except UserError as e:",
        "    print('REFUSED', e)",
        "except MemoryError:",
        "    print('MEMORYERROR')",
    ])
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc are Linux's")
def test_bounded_child_catches_an_allocation():
    """The measuring stick itself: a 1 GiB allocation (untouched, so invisible to RSS) fails."""
    assert bounded("import numpy as np", "np.empty(1 << 30, np.uint8)") == "MEMORYERROR"
    assert bounded("import numpy as np", "np.empty(1 << 20, np.uint8)") == "ACCEPTED"


# ----------------------------------------------------------------------------- pickles never run


class Boom:
    """Unpickling this creates ``marker``: proof that a reader ran the pickle."""

    marker = ""

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(Boom.marker),))


@pytest.fixture
def payload(tmp_path):
    Boom.marker = str(tmp_path / "pwned")
    return pickle.dumps(Boom()), tmp_path / "pwned"


def test_pickle_disguised_as_every_format_is_never_unpickled(payload, tmp_path):
    data, marker = payload
    # as the HF weights (the importer reads only safetensors; the header check refuses it)
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(FIXTURE / "config.json", hf)
    (hf / "model.safetensors").write_bytes(data)
    with pytest.raises(IntegrityError, match=r"model.safetensors: .*header length"):
        hf_import.import_hf_gptj(hf)
    # as a checkpoint's manifest
    ck = tmp_path / "ck"
    CW.save_checkpoint(ck, init(), model_config=CFG.to_dict(), tokenizer=TOK)
    (ck / C.MANIFEST).write_bytes(data)
    with pytest.raises(IntegrityError, match=rf"{C.MANIFEST}: .*(trailing bytes|not a valid manifest)"):
        C.load_checkpoint(ck)
    with pytest.raises(IntegrityError):
        inference.load_model(ck)
    # as a checkpoint part
    CW.save_checkpoint(tmp_path / "ck2", init(), model_config=CFG.to_dict(), tokenizer=TOK)
    part = next((tmp_path / "ck2").glob("*.zst"))
    part.write_bytes(data)
    with pytest.raises(IntegrityError, match=part.name):
        C.load_checkpoint(tmp_path / "ck2")
    # as .npy / .npz (numpy's loader, as the backend uses it: allow_pickle=False)
    obj = np.empty(1, dtype=object)
    obj[0] = Boom()
    np.save(tmp_path / "a.npy", obj, allow_pickle=True)
    np.savez(tmp_path / "a.npz", ok=np.zeros(3), evil=obj)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        np.load(tmp_path / "a.npy", allow_pickle=False)
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:
        assert z["ok"].shape == (3,)
        with pytest.raises(ValueError, match="allow_pickle=False"):
            z["evil"]
    (tmp_path / "raw.npy").write_bytes(data)  # no .npy magic at all
    with pytest.raises(ValueError, match="pickled"):
        np.load(tmp_path / "raw.npy", allow_pickle=False)
    assert not marker.exists()
    pickle.loads(data)  # the payload was live all along
    assert marker.exists()


def test_backend_options_pointing_at_pickles(payload, tmp_path):
    """``model.checkpoint_path`` / ``model.tokenizer_file`` naming pickles, through the CLI."""
    data, marker = payload
    folder = tmp_path / "gptj"
    folder.mkdir()
    shutil.copy(FIXTURE / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(data)
    (tmp_path / "tokenizer.bin").write_bytes(data)
    for key, value in [("checkpoint_path", "gptj"), ("checkpoint_path", "gptj/pytorch_model.bin"),
                       ("tokenizer_file", "tokenizer.bin")]:
        toml = tmp_path / "exp.toml"
        toml.write_text(EXPERIMENT.format(out=(tmp_path / "run").as_posix(), option=f'{key} = "{value}"'))
        res = subprocess.run([sys.executable, "-m", "star_engine", "validate", str(toml)], capture_output=True,
                             text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert res.returncode == 2, (value, res.stdout, res.stderr)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
        assert "Traceback" not in res.stderr and str(tmp_path / value) in res.stderr, res.stderr
        assert not (tmp_path / "run").exists()
    assert not marker.exists()


EXPERIMENT = """
[experiment]
name = "hostile"
iterations = 1
output_dir = "{out}"
[task]
dataset = "addition"
options = {{ n_train = 10, n_dev = 5, max_digits = 2, n_seed = 5 }}
[model]
backend = "haiku_xmap"
tokenizer = "byte"
{option}
"""


def init():
    import jax

    from star_haiku_xmap.model.network import init_params

    return jax.tree.map(np.asarray, init_params(CFG, 0))


# ----------------------------------------------------------------------------- npz (mtj slim checkpoints)


def npy_header(shape, descr="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def forge_member_size(path: Path, member: str, size: int) -> None:
    """Set a stored zip member's sizes in both its local header and the central directory."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    local = data.find(b"PK\x03\x04")
    while local != -1:
        n = struct.unpack_from("<H", data, local + 26)[0]
        if data[local + 30:local + 30 + n] == name:
            struct.pack_into("<II", data, local + 18, size, size)
        local = data.find(b"PK\x03\x04", local + 4)
    central = data.find(b"PK\x01\x02")
    while central != -1:
        n = struct.unpack_from("<H", data, central + 28)[0]
        if data[central + 46:central + 46 + n] == name:
            struct.pack_into("<II", data, central + 20, size, size)
        central = data.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def slim(tmp_path_factory):
    mtj = pytest.importorskip("star_haiku_xmap.convert.mtj_import")
    from star_haiku_xmap.convert.mtj_export import export_mtj

    root = tmp_path_factory.mktemp("slim")
    CW.save_checkpoint(root / "native", init(), model_config=CFG.to_dict(), tokenizer=TOK)
    export_mtj(root / "native", root / "slim", shards=2)
    return mtj, root / "slim"


def copy_slim(slim, dst: Path) -> Path:
    shutil.copytree(slim[1], dst)
    return dst


@pytest.mark.parametrize("header", [
    b"\x93NUMPX\x01\x00",  # bad magic
    b"\x93NUMPY\x07\x00",  # unknown version
    b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4',",  # truncated header
    (lambda h: b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h)(  # code in the header dict
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': __import__('os').system('touch pwned')}\n"),
    b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30) + b"{",  # header length beyond any limit
], ids=["magic", "version", "truncated", "code_in_header", "huge_header"])
def test_forged_npy_header_refused(slim, tmp_path, header):
    mtj, _ = slim
    src = copy_slim(slim, tmp_path / "slim")
    piece = src / "shard_1" / "0.npz"
    with zipfile.ZipFile(piece, "w") as zf:
        zf.writestr("arr_0.npy", header + b"\0" * 64)
    with pytest.raises(IntegrityError, match=r"shard_1/0.npz:arr_0.npy: not a valid .npy header"):
        mtj.plan_mtj(src, CFG)


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc are Linux's")
def test_forged_huge_shape_with_consistent_sizes_refused_before_allocation(slim, tmp_path):
    """The header says 1 GiB and so does the zip directory (the backend's test has a size
    that disagrees with the header); the data is 64 bytes. Refused from the headers alone."""
    src = copy_slim(slim, tmp_path / "slim")
    piece = src / "shard_0" / "1.npz"
    with zipfile.ZipFile(piece) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    name = sorted(members)[0]
    header = npy_header((1 << 28,))
    members[name] = header + b"\0" * 64
    with zipfile.ZipFile(piece, "w", zipfile.ZIP_STORED) as zf:
        for n, blob in members.items():
            zf.writestr(n, blob)
    forge_member_size(piece, name, len(header) + (4 << 28))
    with zipfile.ZipFile(piece) as zf:
        assert zf.getinfo(name).file_size == len(header) + (4 << 28)
    out = bounded(f"""
        from star_haiku_xmap.convert import mtj_import
        from star_haiku_xmap.model.config import GPTJConfig
        cfg = GPTJConfig(**{CFG.to_dict()!r})
    """, f"mtj_import.iter_mtj_gptj({str(src)!r}, cfg)")
    assert out.startswith("REFUSED") and f"{piece}:{name}" in out and "268435456" in out, out


# ----------------------------------------------------------------------------- zstd parts


def zstd_frame(content_size: int, blocks: list[int], window_log: int | None = None) -> bytes:
    """A zstd frame declaring ``content_size``, made of RLE blocks of zeros of the given sizes;
    with ``window_log`` it is not single-segment and declares that window."""
    fhd = (3 << 6) | (0 if window_log else 1 << 5)
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([fhd]))
    if window_log:
        out.append((window_log - 10) << 3)
    out += struct.pack("<Q", content_size)
    for i, n in enumerate(blocks):
        out += ((n << 3) | (1 << 1) | (i == len(blocks) - 1)).to_bytes(3, "little") + b"\x00"
    return bytes(out)


RAW = 4096


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.parametrize("name,blocks,window_log,message", [
    ("streams_1_GiB_more", [RAW] + [1 << 17] * 8192, None, "corrupt zstd data"),
    ("one_block_too_long", [RAW + 1000], None, "corrupt zstd data"),
    ("streams_less", [RAW - 100], None, "corrupt zstd data"),
    ("second_frame_bomb", None, None, "(yields more than 4096 bytes|corrupt zstd data)"),
    ("window_2_GiB", [RAW], 31, None),
    ("window_2_GiB_streams_more", [RAW] + [1 << 17] * 64, 31, "corrupt zstd data"),
], ids=["streams_1_GiB_more", "one_block_too_long", "streams_less", "second_frame_bomb", "window_2_GiB",
        "window_2_GiB_streams_more"])
def test_zstd_part_that_streams_or_declares_too_much(tmp_path, name, blocks, window_log, message):
    """Each frame declares exactly the manifest's size (the backend tests cover a frame that
    declares more); what it streams, or the window it asks for, is the attack."""
    if blocks is None:  # a valid frame followed by a second frame of 1 GiB
        data = zstd_frame(RAW, [RAW]) + zstd_frame(1 << 30, [1 << 17] * 8192)
    else:
        data = zstd_frame(RAW, blocks, window_log)
    part = tmp_path / "00000.zst"
    part.write_bytes(data)
    out = bounded("from star_haiku_xmap.checkpoint.safeio import read_zstd_part",
                  f"read_zstd_part({str(part)!r}, compressed_bytes={len(data)}, raw_bytes={RAW}, "
                  f"sha256={hashlib.sha256(bytes(RAW)).hexdigest()!r})")
    if message is None:  # a legal frame: read in bounded memory, not refused
        assert out == "ACCEPTED", out
    else:
        assert out.startswith(f"REFUSED {part}: ") and re.search(message, out), out


# ----------------------------------------------------------------------------- msgpack manifests


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.parametrize("data,message", [
    (b"\xdd\xff\xff\xff\xff" + b"\xc0" * 16, "exceeds max_array_len"),  # array of 2**32-1 items
    (b"\xdf\xff\xff\xff\xff" + b"\xc0" * 16, "exceeds max_map_len"),  # map of 2**32-1 pairs
    (b"\xdb\xff\xff\xff\xff" + b"a" * 16, "not a valid manifest"),  # str of 4 GiB
    (b"\xc6\xff\xff\xff\xff" + b"a" * 16, "not a valid manifest"),  # bin of 4 GiB
    (b"\xc9\xff\xff\xff\xff\x05" + b"a" * 16, "not a valid manifest"),  # ext of 4 GiB
    (b"\x81\xa1k" * 100_000 + b"\xc0", "not a valid manifest"),  # maps nested 100 000 deep
    (b"\x91\x81\xa1k" * 30 + b"\xc0", "not a valid manifest"),  # lists and maps, 60 deep
    (msgpack.packb({1: "int key"}), "not allowed for map key"),
    (msgpack.packb({"a": msgpack.ExtType(0, b"x")}), "ext type 0 is not allowed"),
    (msgpack.packb({"a": msgpack.ExtType(127, b"x")}), "ext type 127 is not allowed"),
    (b"\x81\xa1a\xd4\x80x", "ext type -128 is not allowed"),  # fixext 1, type -128 (reserved)
    (b"\x81\xa1a\xd5\xfexy", "ext type -2 is not allowed"),  # fixext 2, type -2 (reserved)
], ids=["array32", "map32", "str32", "bin32", "ext32", "deep_maps", "deep_mixed", "int_key", "ext0", "ext127",
        "ext-128", "ext-2"])
def test_hostile_msgpack_refused_in_bounded_memory(data, message, tmp_path):
    blob = tmp_path / "manifest.msgpack"
    blob.write_bytes(data)
    out = bounded(f"from star_haiku_xmap.checkpoint.safeio import unpack_msgpack\ndata = open({str(blob)!r}, 'rb').read()",
                  f"unpack_msgpack(data, what={str(blob)!r})")
    assert out.startswith(f"REFUSED {blob}: ") and message in out, out


def test_msgpack_timestamp_ext_refused():
    with pytest.raises(IntegrityError, match="ext type -1"):
        unpack_msgpack(msgpack.packb({"extra": msgpack.Timestamp(1, 0)}), what="manifest.msgpack")


def test_hostile_manifest_through_load_checkpoint(tmp_path):
    """The same refusals when a checkpoint's manifest is the hostile file."""
    ck = tmp_path / "ck"
    CW.save_checkpoint(ck, init(), model_config=CFG.to_dict(), tokenizer=TOK)
    m = msgpack.unpackb((ck / C.MANIFEST).read_bytes())
    for edit, message in [
        (lambda m: m["leaves"][0].update(shape=[-1, 16]), "bad shape"),
        (lambda m: m["leaves"][0].update(shape=[1 << 40, 1 << 40]), "bad shape"),
        (lambda m: m["leaves"][0].update(raw_bytes=1 << 62), "does not make"),
        (lambda m: m["leaves"][0].update(sha256="0" * 63), "bad sha256"),
        (lambda m: m["leaves"].append(dict(m["leaves"][0])), "duplicate path"),
        (lambda m: m.update(leaves={"not": "a list"}), "'leaves' missing or not a list"),
    ]:
        bad = json.loads(json.dumps(m))
        edit(bad)
        (ck / C.MANIFEST).write_bytes(msgpack.packb(bad))
        with pytest.raises(IntegrityError, match=message) as e:
            C.load_checkpoint(ck)
        assert str(ck / C.MANIFEST) in str(e.value)


# ----------------------------------------------------------------------------- safetensors


def safetensors(path: Path, header: dict | bytes, data: bytes, header_len: int | None = None) -> Path:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if header_len is None else header_len) + h + data)
    return path


A = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


@pytest.mark.parametrize("header,data,header_len,message", [
    ({"a": A}, b"\0" * 16, "len+17", "header length"),  # one byte longer than the file
    ({"a": A}, b"", None, "outside the data section"),  # data section missing
    ({"a": {**A, "shape": [-2, -2]}}, b"\0" * 16, None, "bad shape"),
    ({"a": {**A, "shape": [2.0, 2]}}, b"\0" * 16, None, "bad shape"),
    ({"a": {**A, "shape": [1 << 62, 1 << 62]}}, b"\0" * 16, None, "needs"),  # size overflow
    ({"a": {**A, "data_offsets": [16, 0]}}, b"\0" * 16, None, "outside the data section"),  # reversed
    ({"a": {**A, "data_offsets": [True, 16]}}, b"\0" * 16, None, "outside the data section"),
    ({"a": {**A, "dtype": "F16"}}, b"\0" * 16, None, "needs 8 bytes, data_offsets span 16"),  # dtype/shape
    ({"a": {**A, "shape": [2, 3]}}, b"\0" * 16, None, "needs 24 bytes, data_offsets span 16"),
    ({"a": {**A, "extra": 1}}, b"\0" * 16, None, "exactly dtype, shape, data_offsets"),
    ({"__metadata__": {"k": 1}, "a": A}, b"\0" * 16, None, "__metadata__"),
    (b'{"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, "a": '
     b'{"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}}', b"\0" * 32, None, "unaccounted"),  # duplicate
    ({"a": A, "b": {**A, "data_offsets": [0, 16]}}, b"\0" * 16, None, "overlaps"),  # aliasing tensors
    (b"[1, 2]", b"", None, "not a JSON object"),
], ids=["header_1_byte_long", "no_data", "negative_dims", "float_dims", "overflow", "reversed_offsets",
        "bool_offset", "dtype_mismatch", "shape_mismatch", "extra_field", "bad_metadata", "duplicate_name",
        "aliasing", "not_object"])
def test_hostile_safetensors_refused(tmp_path, header, data, header_len, message):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(h) + 17 if header_len == "len+17" else header_len
    p = safetensors(tmp_path / "model.safetensors", header, data, n)
    with pytest.raises(IntegrityError, match=message) as e:
        read_safetensors_header(p)
    assert str(p) in str(e.value)


def test_safetensors_deeply_nested_header_refused(tmp_path):
    p = safetensors(tmp_path / "model.safetensors", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"")
    with pytest.raises(IntegrityError, match="model.safetensors"):
        read_safetensors_header(p)


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc are Linux's")
def test_safetensors_forged_size_refused_before_allocation(tmp_path):
    """The backend's tiny GPT-J with its embedding re-declared as 64 GiB, in a sparse file whose
    header is consistent (no gap, no overlap, the file long enough): the header check passes,
    and the importer refuses the shape against config.json before reading any tensor."""
    src = tmp_path / "hf"
    src.mkdir()
    shutil.copy(FIXTURE / "config.json", src)
    tensors, _ = read_safetensors_header(FIXTURE / "model.safetensors")
    raw = (FIXTURE / "model.safetensors").read_bytes()
    names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header, blobs, pos = {}, [], 0
    for name, t in sorted(tensors.items(), key=lambda kv: kv[1].start):
        if name != "transformer.wte.weight":
            blobs.append(raw[t.start:t.end])
            header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                            "data_offsets": [pos, pos + t.end - t.start]}
            pos += t.end - t.start
    big = 64 << 30
    header["transformer.wte.weight"] = {"dtype": "F32", "shape": [big // 4 // 64, 64], "data_offsets": [pos, pos + big]}
    h = json.dumps(header).encode()
    p = src / "model.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        f.truncate(8 + len(h) + pos + big)  # sparse: no disk used
    assert read_safetensors_header(p)[0]["transformer.wte.weight"].shape == (big // 4 // 64, 64)
    setup = f"""
        import json
        from star_haiku_xmap.convert import hf_import
        from star_haiku_xmap.checkpoint.format import param_specs
        # jax is imported and initialised before the limit (importing it maps 100s of MB)
        param_specs(hf_import.hf_config_to_gptj(json.load(open({str(src / 'config.json')!r}))).to_dict())
    """
    out = bounded(setup, f"hf_import.import_hf_gptj({str(src)!r})")
    assert out.startswith(f"REFUSED {p}: tensor 'transformer.wte.weight' has shape"), out


# ----------------------------------------------------------------------------- forged sizes that agree with each other


def forged_checkpoint(root: Path, vocab: int) -> tuple[Path, int]:
    """A native checkpoint whose model config, manifest and zstd frames agree on an embedding of
    ``vocab`` x 16 fp32 (and an lm_head to match): the big leaves' parts are ~20-byte frames that
    declare the whole size. Returns (folder, bytes of the embedding)."""
    import zstandard

    cfg = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=64, rotary_dim=4, n_ctx=16, vocab=vocab)
    root.mkdir(parents=True)
    leaves = []
    for i, (path, (shape, dtype)) in enumerate(sorted(C.param_specs(cfg.to_dict()).items())):
        raw = int(np.prod(shape)) * 4
        if raw > 1 << 20:
            blob = zstd_frame(raw, [13])  # a frame that declares `raw` bytes and holds 13
            sha = hashlib.sha256(b"never read").hexdigest()
        else:
            blob = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(raw))
            sha = hashlib.sha256(bytes(raw)).hexdigest()
        (root / f"{i:05d}.zst").write_bytes(blob)
        leaves.append({"path": list(path), "dtype": dtype, "shape": list(shape), "file": f"{i:05d}.zst",
                       "compressed_bytes": len(blob), "raw_bytes": raw, "sha256": sha})
    manifest = {"format": C.FORMAT, "version": C.VERSION, "model_config": cfg.to_dict(), "tokenizer": TOK,
                "extra": {}, "leaves": leaves}
    (root / C.MANIFEST).write_bytes(msgpack.packb(manifest))
    return root, vocab * 16 * 4


@pytest.mark.skipif(not LINUX, reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.parametrize("vocab", [1 << 31, 1 << 24], ids=["128GiB", "1GiB"])
def test_forged_leaf_size_consistent_everywhere_refused_before_allocation(tmp_path, vocab):
    """The embedding (and lm_head) of 128 GiB (over the absolute cap) or 1 GiB (over what this
    child may allocate): every reader refuses, none tries (a MemoryError would say it tried).
    ``load_checkpoint`` puts the small leaves it reads first on a device, which starts jax's CPU
    client: a thread pool as wide as the machine, whose stacks alone exceed the child's margin on
    a many-core machine. The setup starts it before the limit is set, so that the margin measures
    the readers, not the machine's core count (CI failed here on a wider machine)."""
    ck, _ = forged_checkpoint(tmp_path / "ck", vocab)
    for call in (f"C.load_checkpoint({str(ck)!r})",
                 f"m, leaves = C.native_leaves({str(ck)!r})\nfor _ in leaves: pass",
                 f"preflight.check_checkpoint({str(ck)!r})"):
        out = bounded("import jax\njax.devices()\n"
                      "from star_haiku_xmap import preflight\n"
                      "from star_haiku_xmap.checkpoint import format as C\n"
                      "from star_haiku_xmap.checkpoint.format import param_specs\n"
                      f"param_specs(C.read_manifest({str(ck)!r})['model_config'])", call)
        assert out.startswith(f"REFUSED {ck}/"), (call, out)
        refusals = r"(declares|needs) \d+ bytes, more than the|needs a window of|zstd stream ended"
        assert re.search(refusals, out), (call, out)


def test_convert_of_a_forged_checkpoint_is_one_line_and_leaves_nothing(tmp_path):
    ck, _ = forged_checkpoint(tmp_path / "ck", 1 << 31)
    dest = tmp_path / "new" / "dest"
    res = subprocess.run([sys.executable, "-m", "star_engine", "convert", "--from", "native", str(ck), str(dest)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.startswith(f"error: {ck}/") and res.stderr.count("\n") == 1, res.stderr
    assert re.search(r"(declares|needs) \d+ bytes, more than the|needs a window of", res.stderr), res.stderr
    assert not (tmp_path / "new").exists()
