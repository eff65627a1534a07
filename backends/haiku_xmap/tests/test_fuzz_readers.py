"""Fuzzing every checkpoint and weights reader of the backend (hypothesis, fixed budget: see
conftest.py): native checkpoints (msgpack manifest, its schema, zstd parts, split v2 leaves),
msgpack and zstd on their own, Hugging Face folders (config.json, safetensors headers, the index),
mesh-transformer-jax .npz shards and their JSON config, and tokenizer.json. Arbitrary and mutated
inputs end either accepted or in the one-line error (UserError, IntegrityError), never in another
exception, and never allocate more than ``fuzzing.CAP`` (an address-space limit around each call)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import jax
import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from star_testkit.fuzzing import budget, json_values, memory_cap, mutated
from star_engine.errors import UserError
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.convert import hf_import, mtj_export, mtj_import, mtj_layout
from star_haiku_xmap.checkpoint.safeio import read_zstd_part, unpack_msgpack
from star_haiku_xmap.model.network import init_params
from star_haiku_xmap.tokenizer import HFTokenizer, tokenizer_from_dict

CFG = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=64, rotary_dim=4, n_ctx=16, vocab=32)
TOK = {"kind": "byte", "vocab_size": 257, "eos_id": 256}
FIXTURE = Path(__file__).parent / "fixtures" / "gptj_tiny"


def accepted_or_refused(call) -> object:
    """``call()`` under the memory cap: its result, or None when it refused with a UserError."""
    try:
        with memory_cap():
            return call()
    except UserError as e:
        assert str(e) and "\n" not in str(e).strip() or str(e), e
        return None


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_readers")
    params = jax.tree.map(np.asarray, init_params(CFG, 0))
    CW.save_checkpoint(root / "v1", params, model_config=CFG.to_dict(), tokenizer=TOK)
    CW.save_checkpoint(root / "v2", params, model_config=CFG.to_dict(), tokenizer=TOK, mp_split=2)
    mtj_export.export_mtj(root / "v1", root / "slim", shards=2)
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "a", "b", "<|endoftext|>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (root / "tokenizer.json").write_text(tok.to_str())
    C.load_checkpoint(root / "v1")  # jax and the model's shapes warmed up before any cap
    return root


def fresh(work: Path, name: str) -> Path:
    dest = work / f"case-{name}"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(work / name, dest)
    return dest


# ----------------------------------------------------------------------------- native checkpoints


MANIFESTS = {}


def manifest_bytes(work: Path, version: str) -> bytes:
    if version not in MANIFESTS:
        MANIFESTS[version] = (work / version / C.MANIFEST).read_bytes()
    return MANIFESTS[version]


@budget(120)
@given(version=st.sampled_from(["v1", "v2"]), data=st.data())
def test_mutated_manifest_bytes(work, version, data):
    ck = fresh(work, version)
    (ck / C.MANIFEST).write_bytes(data.draw(mutated(manifest_bytes(work, version), max_edits=5)))
    accepted_or_refused(lambda: C.load_checkpoint(ck))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@budget(200)
@given(version=st.sampled_from(["v1", "v2"]), data=st.data())
def test_manifest_values_replaced(work, version, data):
    """Any field of the manifest (a leaf's shape, sizes, sha256, file name, the model config, a
    split part...) replaced by any msgpack value, or removed."""
    ck = fresh(work, version)
    m = msgpack.unpackb(manifest_bytes(work, version))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(m) if p]
        path = data.draw(st.sampled_from(paths))
        node = m
        for key in path[:-1]:
            node = node[key]
        value = data.draw(json_values | st.integers(0, 1 << 62) | st.just(...))
        if value is ... and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = None if value is ... else value
    blob = _pack(m)
    if not blob:  # a value msgpack cannot write (an integer of 70 bits)
        return
    (ck / C.MANIFEST).write_bytes(blob)
    accepted_or_refused(lambda: C.load_checkpoint(ck))
    accepted_or_refused(lambda: list(C.native_leaves(ck)[1]))


@budget(100)
@given(version=st.sampled_from(["v1", "v2"]), data=st.data())
def test_mutated_part_files(work, version, data):
    ck = fresh(work, version)
    parts = sorted(p.name for p in ck.glob("*.zst"))
    name = data.draw(st.sampled_from(parts))
    (ck / name).write_bytes(data.draw(mutated((ck / name).read_bytes(), max_edits=4)))
    loaded = accepted_or_refused(lambda: C.load_checkpoint(ck))
    if loaded is not None:  # only a part that still decodes to the recorded bytes passes (its sha256 is checked)
        for a, b in zip(jax.tree.leaves(loaded[0]), jax.tree.leaves(C.load_checkpoint(work / version)[0])):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@budget(150)
@given(frame=st.binary(max_size=64) | mutated(b"\x28\xb5\x2f\xfd\x20\x10\x81\x00\x00\x01\x02", 4),
       compressed=st.integers(0, 1 << 20), raw=st.sampled_from([0, 1, 16, 1 << 20, 1 << 33, 1 << 50]))
def test_zstd_frames(tmp_path_factory, frame, compressed, raw):
    path = tmp_path_factory.mktemp("zst") / "00000.zst"
    path.write_bytes(frame)
    sha = hashlib.sha256(bytes(min(raw, 16))).hexdigest()
    accepted_or_refused(lambda: read_zstd_part(path, compressed_bytes=len(frame) if compressed % 2 else compressed,
                                               raw_bytes=raw, sha256=sha))


def _pack(value) -> bytes:
    try:
        return msgpack.packb(value)
    except (OverflowError, ValueError, TypeError):  # an integer of more than 64 bits: msgpack has none
        return b""


@budget(150)
@given(data=st.binary(max_size=200) | json_values.map(_pack).filter(bool))
def test_msgpack(data):
    accepted_or_refused(lambda: unpack_msgpack(data, what="manifest.msgpack"))


# ----------------------------------------------------------------------------- Hugging Face folders


def _safetensors(header: dict | bytes, data: bytes, header_len: int | None = None) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if header_len is None else header_len) + h + data


TENSOR = st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "F16", "BF16", "I8", "F64", "X"]) | json_values,
                                "shape": st.lists(st.integers(-2, 1 << 40), max_size=3) | json_values,
                                "data_offsets": st.lists(st.integers(-1, 1 << 62), min_size=2, max_size=2)
                                | json_values})


@budget(150)
@given(header=st.dictionaries(st.text(max_size=10), TENSOR | json_values, max_size=4), data=st.binary(max_size=64),
       lie=st.none() | st.integers(0, 1 << 63))
def test_safetensors_headers(tmp_path_factory, header, data, lie):
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    path.write_bytes(_safetensors(header, data, lie))
    accepted_or_refused(lambda: hf_import.read_safetensors_header(path))


@budget(100)
@given(which=st.sampled_from(["model.safetensors", "config.json"]), data=st.data())
def test_hf_folder_with_a_mutated_file(work, which, data):
    src = work / "case-hf"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, src / name)
    original = (FIXTURE / which).read_bytes()
    if which == "model.safetensors":  # mutate inside the header, or anywhere
        n = struct.unpack("<Q", original[:8])[0]
        blob = data.draw(mutated(original[:8 + n], 4)) + original[8 + n:] if data.draw(st.booleans()) else \
            data.draw(mutated(original, 4))
    else:
        cfg = json.loads(original)
        cfg[data.draw(st.sampled_from(sorted(cfg)))] = data.draw(json_values)
        blob = json.dumps(cfg).encode() if data.draw(st.booleans()) else data.draw(mutated(original, 4))
    (src / which).write_bytes(blob)
    accepted_or_refused(lambda: hf_import.import_hf_gptj(src))


@budget(60)
@given(weight_map=json_values | st.dictionaries(st.text(max_size=6), json_values, max_size=3))
def test_hf_index_files(work, weight_map):
    src = work / "case-index"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    shutil.copy(FIXTURE / "config.json", src / "config.json")
    shutil.copy(FIXTURE / "model.safetensors", src / "model.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    accepted_or_refused(lambda: hf_import.import_hf_gptj(src))


# ----------------------------------------------------------------------------- mesh-transformer-jax shards


@budget(100)
@given(data=st.data())
def test_mutated_npz_shards(work, data):
    src = fresh(work, "slim")
    pieces = sorted(src.glob("shard_*/*.npz"))
    piece = data.draw(st.sampled_from(pieces))
    piece.write_bytes(data.draw(mutated(piece.read_bytes(), max_edits=4)))

    def convert():
        _, leaves = mtj_import.iter_mtj_gptj(src, CFG)
        return [v for _, v in leaves]

    accepted_or_refused(convert)


@budget(80)
@given(cfg=st.dictionaries(st.sampled_from(["layers", "d_model", "n_heads", "n_vocab", "pe_rotary_dims", "seq",
                                            "pe", "norm", "n_layer", "vocab"]), json_values, max_size=8))
def test_mtj_json_configs(tmp_path_factory, cfg):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(cfg))
    accepted_or_refused(lambda: mtj_layout.config_from_file(path))


# ----------------------------------------------------------------------------- tokenizer.json


@budget(100)
@given(data=st.data())
def test_mutated_tokenizer_json(work, data):
    path = work / "case-tokenizer.json"
    original = (work / "tokenizer.json").read_bytes()
    if data.draw(st.booleans()):
        blob = data.draw(mutated(original, 5))
    else:
        doc = json.loads(original)
        doc[data.draw(st.sampled_from(sorted(doc)))] = data.draw(json_values)
        blob = json.dumps(doc).encode()
    path.write_bytes(blob)
    tok = accepted_or_refused(lambda: HFTokenizer(path))
    if tok is not None:
        assert tok.decode(tok.encode("a b <|endoftext|>")) is not None


@budget(100)
@given(d=st.dictionaries(st.sampled_from(["kind", "sha256", "path", "json", "eos_token", "vocab_size"]),
                         json_values, max_size=6))
def test_stored_tokenizer_descriptions(d):
    accepted_or_refused(lambda: tokenizer_from_dict(d))
