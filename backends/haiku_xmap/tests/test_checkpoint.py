"""Native checkpoints: round trips, atomic replacement, and hostile files."""

from __future__ import annotations

import os
import struct
import tracemalloc

import jax
import ml_dtypes
import msgpack
import numpy as np
import pytest
import zstandard

from star_engine.errors import IntegrityError, UserError
from star_engine.rundir.store import clean_temporaries, is_temporary
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.model.network import init_params

CFG = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=32, rotary_dim=4, n_ctx=16, vocab=40)
TOK = {"kind": "byte", "vocab_size": 257, "eos_id": 256}


def params_for(cfg=CFG, seed=0):
    return jax.tree.map(np.asarray, init_params(cfg, seed))


def save(path, params=None, cfg=CFG, **kw):
    return CW.save_checkpoint(path, params_for(cfg) if params is None else params,
                             model_config=cfg.to_dict(), tokenizer=TOK, **kw)


def assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def rewrite_manifest(path, edit):
    m = msgpack.unpackb((path / C.MANIFEST).read_bytes())
    edit(m)
    (path / C.MANIFEST).write_bytes(msgpack.packb(m))


def leaf_entry(m, name):
    return next(e for e in m["leaves"] if "/".join(e["path"]) == name)


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_roundtrip_bitwise(tmp_path, dtype):
    cfg = CFG.replace(dtype=dtype)
    params = params_for(cfg)
    manifest = save(tmp_path / "ck", params, cfg, extra={"step": 7, "note": "x"})
    loaded, m = C.load_checkpoint(tmp_path / "ck")
    assert_same(params, loaded)
    assert m == manifest
    assert m["model_config"] == cfg.to_dict() and m["tokenizer"] == TOK and m["extra"] == {"step": 7, "note": "x"}
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded))
    e = leaf_entry(m, "h_0/attn/q/w")
    assert e["dtype"] == dtype and e["shape"] == [16, 16] and e["raw_bytes"] == 16 * 16 * (2 if dtype == "bfloat16" else 4)
    if dtype == "bfloat16":
        assert loaded["wte"]["embeddings"].dtype == ml_dtypes.bfloat16
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == sorted(
        [C.MANIFEST] + [e["file"] for e in m["leaves"]])


def test_manifest_is_deterministic(tmp_path):
    save(tmp_path / "a")
    save(tmp_path / "b")
    assert C.manifest_sha256(tmp_path / "a") == C.manifest_sha256(tmp_path / "b")
    save(tmp_path / "c", params_for(seed=1))
    assert C.manifest_sha256(tmp_path / "a") != C.manifest_sha256(tmp_path / "c")


def test_load_with_shardings(tmp_path):
    from jax.sharding import NamedSharding, PartitionSpec as P

    params = params_for()
    save(tmp_path / "ck", params)
    mesh = jax.make_mesh((1, 1), ("dp", "mp"), devices=jax.devices()[:1])
    sh = jax.tree.map(lambda x: NamedSharding(mesh, P(*([None] * x.ndim))), params)
    loaded, _ = C.load_checkpoint(tmp_path / "ck", shardings=sh)
    assert_same(params, loaded)
    assert all(x.sharding == s for x, s in zip(jax.tree.leaves(loaded), jax.tree.leaves(sh)))
    del sh["lm_head"]
    for e in os.listdir(tmp_path / "ck"):
        if e.endswith(".zst"):
            os.remove(tmp_path / "ck" / e)  # the structure check must come before any part is read
    with pytest.raises(UserError, match="shardings has no entry for parameter lm_head"):
        C.load_checkpoint(tmp_path / "ck", shardings=sh)


# ----------------------------------------------------------------------------- writing


def test_replace_existing_and_leave_identical_alone(tmp_path):
    dest = tmp_path / "ck"
    save(dest)
    inode = (dest / C.MANIFEST).stat().st_ino
    save(dest)  # identical: untouched
    assert (dest / C.MANIFEST).stat().st_ino == inode
    new = params_for(seed=3)
    save(dest, new)
    assert_same(new, C.load_checkpoint(dest)[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temp or old dirs left


def test_replace_without_rename_exchange(tmp_path, monkeypatch):
    dest = tmp_path / "ck"
    save(dest)
    monkeypatch.setattr(CW, "_exchange", lambda a, b: False)  # e.g. a filesystem without RENAME_EXCHANGE
    new = params_for(seed=4)
    save(dest, new)
    assert_same(new, C.load_checkpoint(dest)[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_kill_inside_the_fallback_window_leaves_only_temporaries(tmp_path, monkeypatch):
    dest = tmp_path / "ck"
    save(dest)
    monkeypatch.setattr(CW, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def killed_before_moving_the_new_one_in(src, dst):
        if os.fspath(dst) == os.fspath(dest):
            raise KeyboardInterrupt  # the old checkpoint is moved aside, the new one not yet in place
        real_rename(src, dst)

    monkeypatch.setattr(CW.os, "rename", killed_before_moving_the_new_one_in)
    with pytest.raises(KeyboardInterrupt):
        save(dest, params_for(seed=4))
    monkeypatch.setattr(CW.os, "rename", real_rename)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left and all(is_temporary(name) for name in left), left  # what a restarted run cleans away
    assert clean_temporaries(tmp_path) == len(left) and not list(tmp_path.iterdir())


def test_rename_exchange_swaps(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("b")
    if not CW._exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("renameat2(RENAME_EXCHANGE) unsupported here; the fallback is tested above")
    assert (tmp_path / "a" / "x").read_text() == "b" and (tmp_path / "b" / "x").read_text() == "a"


def test_failed_write_leaves_existing_checkpoint(tmp_path, monkeypatch):
    dest = tmp_path / "ck"
    save(dest)
    before = C.manifest_sha256(dest)
    calls = []
    real = CW.write_zstd_part

    def dying(path, raw, **kw):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-write")
        return real(path, raw, **kw)

    monkeypatch.setattr(CW, "write_zstd_part", dying)
    with pytest.raises(KeyboardInterrupt):
        save(dest, params_for(seed=5))
    assert C.manifest_sha256(dest) == before
    C.load_checkpoint(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_refuses_to_replace_non_checkpoint(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("keep me")
    with pytest.raises(UserError, match="not a checkpoint"):
        save(tmp_path / "data")
    assert (tmp_path / "data" / "precious.txt").read_text() == "keep me"


def test_refuses_params_that_do_not_match_config(tmp_path):
    params = params_for()
    params["lm_head"]["w"] = np.zeros((16, 41), np.float32)
    with pytest.raises(UserError, match=r"lm_head/w is float32\[16, 41\]"):
        save(tmp_path / "a", params)
    params = params_for()
    del params["ln_f"]
    with pytest.raises(UserError, match="missing.*ln_f"):
        save(tmp_path / "b", params)
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- hostile parts


def test_truncated_part_is_refused(tmp_path):
    m = save(tmp_path / "ck")
    part = tmp_path / "ck" / leaf_entry(m, "h_0/mlp/fc_in/w")["file"]
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(IntegrityError, match=f"{part.name}.*truncated"):
        C.load_checkpoint(tmp_path / "ck")


def test_bit_flip_is_refused(tmp_path):
    m = save(tmp_path / "ck")
    part = tmp_path / "ck" / leaf_entry(m, "h_0/mlp/fc_in/w")["file"]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x10
    part.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=part.name):
        C.load_checkpoint(tmp_path / "ck")


def test_valid_frame_with_wrong_content_fails_sha(tmp_path):
    m = save(tmp_path / "ck")
    e = leaf_entry(m, "wte/embeddings")
    raw = np.ones(e["raw_bytes"], np.uint8).tobytes()
    blob = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    (tmp_path / "ck" / e["file"]).write_bytes(blob)
    rewrite_manifest(tmp_path / "ck", lambda mm: leaf_entry(mm, "wte/embeddings").update(compressed_bytes=len(blob)))
    with pytest.raises(IntegrityError, match=f"{e['file']}: sha256 .* does not match"):
        C.load_checkpoint(tmp_path / "ck")


def zstd_bomb(content_size: int) -> bytes:
    """A valid zstd frame declaring ``content_size`` bytes of zeros, as RLE blocks (~32 KiB per GiB)."""
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", content_size))
    block = 1 << 17
    left = content_size
    while left:
        n = min(block, left)
        left -= n
        header = (n << 3) | (1 << 1) | (1 if left == 0 else 0)
        out += header.to_bytes(3, "little") + b"\x00"
    return bytes(out)


def test_zstd_bomb_refused_before_allocation(tmp_path):
    bomb = zstd_bomb(1 << 30)
    assert len(bomb) < 64 << 10 and zstandard.frame_content_size(bomb) == 1 << 30
    m = save(tmp_path / "ck")
    e = leaf_entry(m, "h_0/mlp/fc_in/w")
    (tmp_path / "ck" / e["file"]).write_bytes(bomb)
    rewrite_manifest(tmp_path / "ck", lambda mm: leaf_entry(mm, "h_0/mlp/fc_in/w").update(compressed_bytes=len(bomb)))
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match=f"{e['file']}: zstd frame declares 1073741824 bytes"):
            C.load_checkpoint(tmp_path / "ck")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20


def test_frame_without_declared_size_is_refused(tmp_path):
    m = save(tmp_path / "ck")
    e = leaf_entry(m, "ln_f/scale")
    blob = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * e["raw_bytes"])
    assert zstandard.frame_content_size(blob) == -1
    (tmp_path / "ck" / e["file"]).write_bytes(blob)
    rewrite_manifest(tmp_path / "ck", lambda mm: leaf_entry(mm, "ln_f/scale").update(compressed_bytes=len(blob)))
    with pytest.raises(IntegrityError, match="declares unknown bytes"):
        C.load_checkpoint(tmp_path / "ck")


# ----------------------------------------------------------------------------- hostile manifests


def test_manifest_ext_type_refused(tmp_path):
    save(tmp_path / "ck")
    rewrite_manifest(tmp_path / "ck", lambda m: m["extra"].update(x=msgpack.ExtType(42, b"payload")))
    with pytest.raises(IntegrityError, match="ext type 42"):
        C.load_checkpoint(tmp_path / "ck")


@pytest.mark.parametrize("depth", [40, 100_000])
def test_manifest_deep_nesting_refused(tmp_path, depth):
    save(tmp_path / "ck")
    data = bytearray((tmp_path / "ck" / C.MANIFEST).read_bytes())
    # replace the whole manifest by {"format": [[[...nil...]]]}
    data = b"\x81\xa6format" + b"\x91" * depth + b"\xc0"
    (tmp_path / "ck" / C.MANIFEST).write_bytes(data)
    with pytest.raises(IntegrityError, match="not a valid manifest"):
        C.load_checkpoint(tmp_path / "ck")


def test_manifest_size_trailing_and_schema(tmp_path):
    save(tmp_path / "ck")
    path = tmp_path / "ck" / C.MANIFEST
    good = path.read_bytes()
    path.write_bytes(good + b"\xc0")
    with pytest.raises(IntegrityError, match="trailing bytes"):
        C.load_checkpoint(tmp_path / "ck")
    with open(path, "wb") as f:  # sparse: 1 GiB on paper, refused without reading
        f.truncate(1 << 30)
    with pytest.raises(IntegrityError, match="more than the limit"):
        C.load_checkpoint(tmp_path / "ck")
    path.write_bytes(good)
    rewrite_manifest(tmp_path / "ck", lambda m: m["leaves"][0].update(file="../../etc/passwd"))
    with pytest.raises(IntegrityError, match="bad or duplicate part file name"):
        C.load_checkpoint(tmp_path / "ck")
    path.write_bytes(good)
    rewrite_manifest(tmp_path / "ck", lambda m: m.update(version=99))
    with pytest.raises(IntegrityError, match="unsupported version 99"):
        C.load_checkpoint(tmp_path / "ck")


def test_shape_and_dtype_checked_against_config_before_reading_parts(tmp_path):
    save(tmp_path / "ck")
    good = (tmp_path / "ck" / C.MANIFEST).read_bytes()
    for e in os.listdir(tmp_path / "ck"):
        if e.endswith(".zst"):
            os.remove(tmp_path / "ck" / e)

    def bigger(m):  # consistent with itself (raw_bytes), not with the config
        leaf_entry(m, "lm_head/b").update(shape=[1 << 28], raw_bytes=4 << 28)

    rewrite_manifest(tmp_path / "ck", bigger)
    with pytest.raises(IntegrityError, match=r"lm_head/b is float32\[268435456\], the model config needs float32\[40\]"):
        C.load_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / C.MANIFEST).write_bytes(good)
    rewrite_manifest(tmp_path / "ck", lambda m: leaf_entry(m, "lm_head/b").update(dtype="bfloat16", raw_bytes=80))
    with pytest.raises(IntegrityError, match=r"lm_head/b is bfloat16"):
        C.load_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / C.MANIFEST).write_bytes(good)
    rewrite_manifest(tmp_path / "ck", lambda m: leaf_entry(m, "lm_head/b").update(raw_bytes=12))
    with pytest.raises(IntegrityError, match=r"does not make 12 bytes"):
        C.load_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / C.MANIFEST).write_bytes(good)
    rewrite_manifest(tmp_path / "ck", lambda m: m["model_config"].update(vocab=-3))
    with pytest.raises(IntegrityError, match="not a valid GPT-J config"):
        C.load_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / C.MANIFEST).write_bytes(good)
    with pytest.raises(IntegrityError, match="part file missing"):  # only now are parts touched
        C.load_checkpoint(tmp_path / "ck")
