"""mesh-transformer-jax slim checkpoints: import (logits against the original
parameters, bf16 stored as V2, summed biases), export and exact round trips, and
hostile npz files (pickles, wrong shapes/dtypes, bombs) refused before allocation.

The slim checkpoints here are written by a small writer of this file, independent
of ``mtj_import``: it builds mesh-transformer-jax's ``{"params", "step"}`` tree
with its haiku module names, flattens it with jax (sorted keys, as
mesh-transformer-jax does), cuts the leaf list into 16 files per shard and saves
each with ``np.savez`` (bf16 viewed as ``V2``).
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from star_engine.errors import IntegrityError, UserError
from star_haiku_xmap.model import network as model
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.convert import mtj_export, mtj_import, mtj_layout

CFG = GPTJConfig(n_layer=3, d_model=32, n_head=8, d_head=4, d_ff=128, rotary_dim=4, n_ctx=32, vocab=264)
TOK = {"kind": "byte", "vocab_size": 257, "eos_id": 256}
SHARDS = 4
BF16 = np.dtype(ml_dtypes.bfloat16)


def mtj_tree(params: dict, shards: int, rng: np.random.Generator, dtype) -> tuple[dict, dict]:
    """mesh-transformer-jax's per-shard trees for ``params`` (this backend's names),
    with a random embedding bias per shard (wte minus their sum stays in ``w``) and
    fc_out biases spread over the shards. Returns (trees[shard], expected params)."""
    P = "causal_transformer_shard/~/"
    f32 = lambda x: np.asarray(x, np.float32)
    cast = lambda x: np.asarray(x, np.float32).astype(dtype)
    trees = [{"params": {}, "step": np.asarray(1234, np.uint32)} for _ in range(shards)]
    expected = {k: dict(v) for k, v in params.items()}

    def put(module, name, pieces):
        for s in range(shards):
            trees[s]["params"].setdefault(P + module, {})[name] = pieces[s]

    def split(x, axis):
        return [cast(p) for p in np.split(f32(x), shards, axis=axis)]

    # embedding: one-hot matmul with a bias that every shard adds
    bias = [cast(rng.normal(0, 0.5, CFG.d_model)) for _ in range(shards)]
    w = cast(f32(params["wte"]["embeddings"]))
    put("embedding_shard/~/linear", "b", bias)
    put("embedding_shard/~/linear", "w", split(w, 0))
    expected["wte"]["embeddings"] = (f32(w) + sum(f32(b) for b in bias)).astype(dtype)
    for i in range(CFG.n_layer):
        h = f"h_{i}/"
        L = f"layer_{i}/~/"
        put(L + "linear", "w", split(params[h + "attn/q"]["w"], 1))
        put(L + "linear_1", "w", split(params[h + "attn/v"]["w"], 1))
        put(L + "linear_2", "w", split(params[h + "attn/k"]["w"], 1))
        put(L + "linear_3", "w", split(params[h + "attn/out"]["w"], 0))
        put(L + "linear_4", "w", split(params[h + "mlp/fc_in"]["w"], 1))
        put(L + "linear_4", "b", split(params[h + "mlp/fc_in"]["b"], 0))
        put(L + "linear_5", "w", split(params[h + "mlp/fc_out"]["w"], 0))
        fc_out_b = [cast(rng.normal(0, 0.3, CFG.d_model)) for _ in range(shards)]
        put(L + "linear_5", "b", fc_out_b)
        expected[h + "mlp/fc_out"]["b"] = sum(f32(b) for b in fc_out_b).astype(dtype)
        # mesh-transformer-jax reads shard 0's copy only (all_gather(...)[0]), so only that one
        # trains: the other shards keep their init values in a released checkpoint
        put(L + "replicated_layer_norm", "scale", [cast(params[h + "ln"]["scale"])] + [cast(np.ones(CFG.d_model))] * (shards - 1))
        put(L + "replicated_layer_norm", "offset", [cast(params[h + "ln"]["offset"])] + [cast(np.zeros(CFG.d_model))] * (shards - 1))
    put("projection_shard/~/linear", "w", split(params["lm_head"]["w"], 1))
    put("projection_shard/~/linear", "b", split(params["lm_head"]["b"], 0))
    put("projection_shard/~/replicated_layer_norm", "scale", [cast(params["ln_f"]["scale"])] + [cast(np.ones(CFG.d_model))] * (shards - 1))
    put("projection_shard/~/replicated_layer_norm", "offset", [cast(params["ln_f"]["offset"])] + [cast(np.zeros(CFG.d_model))] * (shards - 1))
    for k in expected:
        for n in expected[k]:
            expected[k][n] = np.asarray(expected[k][n]).astype(dtype)
    return trees, expected


def write_slim(trees: list[dict], dest: Path, pieces: int = 16) -> None:
    """mesh-transformer-jax's write_ckpt layout: leaves in sorted-key order, 16 files."""
    for s, tree in enumerate(trees):
        leaves = jax.tree.leaves(tree)
        k, m = divmod(len(leaves), pieces)
        (dest / f"shard_{s}").mkdir(parents=True)
        for i in range(pieces):
            chunk = leaves[i * k + min(i, m):(i + 1) * k + min(i + 1, m)]
            chunk = [x.view("V2") if x.dtype == BF16 else x for x in chunk]
            np.savez(dest / f"shard_{s}" / f"{i}.npz", *chunk)


def perturbed_params(seed=0):
    rng = np.random.default_rng(seed)
    params = jax.tree.map(np.asarray, model.init_params(CFG, seed))
    for k, v in params.items():  # LayerNorms and biases away from 1/0, so a mis-mapping shows  # noqa: B007
        for n in v:
            if n in ("scale", "offset", "b"):
                v[n] = (v[n] + rng.normal(0, 0.3, v[n].shape)).astype(np.float32)
    return params


@pytest.fixture(scope="module")
def slim(tmp_path_factory):
    out = {}
    for dtype in ("float32", "bfloat16"):
        root = tmp_path_factory.mktemp(f"mtj_{dtype}")
        trees, expected = mtj_tree(perturbed_params(), SHARDS, np.random.default_rng(1),
                                   np.float32 if dtype == "float32" else BF16)
        write_slim(trees, root / "slim")
        out[dtype] = (root / "slim", expected)
    return out


def logits_of(params, config):
    tokens = np.arange(20, dtype=np.int32).reshape(2, 10) % config.vocab
    return np.asarray(model.forward(jax.tree.map(np.asarray, params), tokens, config))


def load(path):
    return C.load_checkpoint(path)[0]


# ----------------------------------------------------------------------------- layout


def test_leaf_names_and_order_match_mesh_transformer_jax():
    layout = mtj_layout.leaf_layout(CFG.replace(n_layer=12), 8)
    names = [leaf.name for leaf in layout]
    assert len(names) == 2 + 12 * 10 + 4 + 1  # the "reduced" (slim) leaf list
    assert names[:4] == ["params/causal_transformer_shard/~/embedding_shard/~/linear/b",
                         "params/causal_transformer_shard/~/embedding_shard/~/linear/w",
                         "params/causal_transformer_shard/~/layer_0/~/linear/w",
                         "params/causal_transformer_shard/~/layer_0/~/linear_1/w"]
    layers = [n.split("/~/")[1] for n in names if "/layer_" in n][::10]
    assert layers == ["layer_0", "layer_1", "layer_10", "layer_11"] + [f"layer_{i}" for i in range(2, 10)]
    assert names[-1] == "step" and names[-2].endswith("projection_shard/~/replicated_layer_norm/scale")
    q = next(x for x in layout if x.name.endswith("layer_0/~/linear/w"))
    v = next(x for x in layout if x.name.endswith("layer_0/~/linear_1/w"))
    assert q.native == ("h_0/attn/q", "w") and v.native == ("h_0/attn/v", "w")  # q, v, k order
    assert mtj_layout.piece_sizes(287) == [18] * 15 + [17]


def test_gptj6b_shard_shapes():
    from star_haiku_xmap.model.config import PRESETS

    layout = {x.name.removeprefix("params/causal_transformer_shard/~/"): x
              for x in mtj_layout.leaf_layout(PRESETS["gptj-6b"], 8)}
    assert layout["layer_0/~/linear/w"].shard_shape == (4096, 512)
    assert layout["layer_0/~/linear_3/w"].shard_shape == (512, 4096)
    assert layout["layer_0/~/linear_4/w"].shard_shape == (4096, 2048)
    assert layout["layer_0/~/linear_5/w"].shard_shape == (2048, 4096)
    assert layout["embedding_shard/~/linear/w"].shard_shape == (6300, 4096)
    assert layout["projection_shard/~/linear/w"].shard_shape == (4096, 6300)


# ----------------------------------------------------------------------------- import


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_import_matches_original_params_and_logits(tmp_path, slim, dtype):
    src, expected = slim[dtype]
    config = CFG.replace(dtype=dtype)
    mtj_import.convert_mtj_gptj(src, tmp_path / "ck", config=config, tokenizer=TOK)
    got = load(tmp_path / "ck")
    for k in expected:
        for n in expected[k]:
            assert got[k][n].dtype == np.dtype(expected[k][n].dtype), f"{k}/{n}"
            np.testing.assert_array_equal(np.asarray(got[k][n]).astype(np.float32),
                                          expected[k][n].astype(np.float32), err_msg=f"{k}/{n}")
    want = logits_of(expected, config)
    np.testing.assert_allclose(logits_of(got, config), want, rtol=0, atol=1e-5 if dtype == "float32" else 1e-2)
    m = C.read_manifest(tmp_path / "ck")
    assert m["extra"]["source"] == "mtj_slim" and m["extra"]["mtj_step"] == 1234


def test_bf16_stored_as_v2(slim):
    src, _ = slim["bfloat16"]
    with np.load(src / "shard_0" / "0.npz", allow_pickle=False) as z:
        assert z["arr_0"].dtype == np.dtype("V2")


def test_cast_on_import(tmp_path, slim):
    src, expected = slim["float32"]
    mtj_import.convert_mtj_gptj(src, tmp_path / "ck", config=CFG.replace(dtype="bfloat16"), tokenizer=TOK)
    got = load(tmp_path / "ck")
    assert got["h_0/attn/q"]["w"].dtype == BF16
    np.testing.assert_array_equal(np.asarray(got["h_0/attn/q"]["w"]), expected["h_0/attn/q"]["w"].astype(BF16))


# ----------------------------------------------------------------------------- round trips


def test_mtj_native_mtj_native_is_exact(tmp_path, slim):
    """mtj (4 shards) -> native -> mtj with 2 and 8 shards -> native: identical bytes."""
    src, _ = slim["bfloat16"]
    config = CFG.replace(dtype="bfloat16")
    mtj_import.convert_mtj_gptj(src, tmp_path / "a", config=config, tokenizer=TOK)
    a = load(tmp_path / "a")
    for shards in (2, 8):
        mtj_export.export_mtj(tmp_path / "a", tmp_path / f"mtj{shards}", shards=shards)
        assert sorted(p.name for p in (tmp_path / f"mtj{shards}").iterdir()) == [f"shard_{i}" for i in range(shards)]
        assert len(list((tmp_path / f"mtj{shards}" / "shard_0").iterdir())) == 16
        mtj_import.convert_mtj_gptj(tmp_path / f"mtj{shards}", tmp_path / f"b{shards}", config=config, tokenizer=TOK)
        b = load(tmp_path / f"b{shards}")
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_cli_mtj_to_native_to_mp4_and_back_identical_logits(tmp_path, slim):
    from star_engine.cli import main

    src, expected = slim["bfloat16"]
    cfg_file = tmp_path / "mtj_config.json"  # mesh-transformer-jax's own config keys
    cfg_file.write_text(json.dumps({"layers": CFG.n_layer, "d_model": CFG.d_model, "n_heads": CFG.n_head,
                                    "n_vocab": CFG.vocab, "pe_rotary_dims": CFG.rotary_dim, "seq": CFG.n_ctx,
                                    "norm": "layernorm", "pe": "rotary", "cores_per_replica": SHARDS}))
    assert main(["convert", "--from", "mtj", str(src), str(tmp_path / "n1"), "--config", str(cfg_file),
                 "--byte-tokenizer"]) == 0
    assert main(["convert", "--from", "native", str(tmp_path / "n1"), str(tmp_path / "n4"), "--mp", "4"]) == 0
    assert main(["convert", "--from", "native", str(tmp_path / "n4"), str(tmp_path / "m8"), "--to", "mtj",
                 "--mp", "8"]) == 0
    assert main(["convert", "--from", "mtj", str(tmp_path / "m8"), str(tmp_path / "back"), "--config",
                 str(cfg_file), "--byte-tokenizer"]) == 0
    assert main(["convert", "--from", "native", str(tmp_path / "n4"), str(tmp_path / "n1b"), "--mp", "1"]) == 0
    m4 = C.read_manifest(tmp_path / "n4")
    assert m4["version"] == 2 and m4["mp_split"] == 4
    q = next(e for e in m4["leaves"] if e["path"] == ["h_0/attn/q", "w"])
    assert q["split_axis"] == 1 and len(q["parts"]) == 4
    ln = next(e for e in m4["leaves"] if e["path"] == ["h_0/ln", "scale"])
    assert "parts" not in ln  # replicated leaves stay whole
    config = CFG.replace(dtype="bfloat16")
    ref = logits_of(load(tmp_path / "n1"), config)
    np.testing.assert_allclose(ref, logits_of(expected, config), atol=1e-2)
    for name in ("n4", "back", "n1b"):
        np.testing.assert_array_equal(logits_of(load(tmp_path / name), config), ref, err_msg=name)
    # the unsplit checkpoint written back from the split one is the original, byte for byte
    assert C.manifest_sha256(tmp_path / "n1b") == C.manifest_sha256(tmp_path / "n1")


# ----------------------------------------------------------------------------- hostile input


def _copy(src: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(src, dest)
    return dest


def _rewrite_piece(path: Path, edit) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
    arrays = edit(arrays)
    np.savez(path, *arrays)


def test_wrong_shape_refused_before_any_array_is_read(tmp_path, slim, monkeypatch):
    src = _copy(slim["float32"][0], tmp_path / "slim")
    _rewrite_piece(src / "shard_2" / "0.npz", lambda a: [a[0], a[1][:-1]] + a[2:])
    reads = []
    monkeypatch.setattr(mtj_import, "_read_member", lambda *a, **k: reads.append(a))
    with pytest.raises(UserError, match=r"shard_2/0.npz:arr_1.npy .*embedding_shard/~/linear/w.*shape \[65, 32\]"):
        mtj_import.iter_mtj_gptj(src, CFG)
    assert reads == []


def test_wrong_dtype_and_count_refused(tmp_path, slim):
    src = _copy(slim["float32"][0], tmp_path / "slim")
    _rewrite_piece(src / "shard_1" / "3.npz", lambda a: [a[0].astype(np.float64)] + a[1:])
    with pytest.raises(UserError, match="dtype float64 is not bf16"):
        mtj_import.plan_mtj(src, CFG)
    src = _copy(slim["float32"][0], tmp_path / "slim2")
    _rewrite_piece(src / "shard_0" / "15.npz", lambda a: a + [np.zeros(3, np.float32)])
    with pytest.raises(UserError, match="arrays, a 3-layer GPT-J slim checkpoint has"):
        mtj_import.plan_mtj(src, CFG)
    with pytest.raises(UserError, match="n_head x d_head"):
        mtj_import.plan_mtj(slim["float32"][0], CFG.replace(d_head=2, rotary_dim=2))
    with pytest.raises(UserError, match="not divisible by 4 shards"):
        mtj_import.plan_mtj(slim["float32"][0], CFG.replace(vocab=50))


def test_pickled_member_refused_without_unpickling(tmp_path, slim):
    src = _copy(slim["float32"][0], tmp_path / "slim")
    called = []

    class Boom:
        def __reduce__(self):
            return (called.append, ("unpickled!",))

    path = src / "shard_0" / "2.npz"
    with np.load(path, allow_pickle=False) as z:
        arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
    obj = np.empty(1, dtype=object)
    obj[0] = Boom()
    np.savez(path, obj, *arrays[1:])  # arr_0 becomes an object array (a pickle inside the .npy)
    with pytest.raises(IntegrityError, match="not a plain numeric type"):
        mtj_import.plan_mtj(src, CFG)
    assert called == []


def test_member_size_lie_and_strange_members_refused(tmp_path, slim):
    src = _copy(slim["float32"][0], tmp_path / "slim")
    path = src / "shard_0" / "1.npz"
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("extra.pkl", pickle.dumps({"a": 1}))
    with pytest.raises(IntegrityError, match="unexpected member 'extra.pkl'"):
        mtj_import.plan_mtj(src, CFG)
    # a header that claims a huge array in a small member: refused before allocating
    src = _copy(slim["float32"][0], tmp_path / "slim2")
    path = src / "shard_0" / "1.npz"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("arr_0.npy", buf.getvalue() + b"\0" * 64)
    with pytest.raises(IntegrityError, match="the header implies"):
        mtj_import.plan_mtj(src, CFG)
    (src / "shard_0" / "1.npz").write_bytes(b"not a zip")
    with pytest.raises(IntegrityError, match="not a readable zip"):
        mtj_import.plan_mtj(src, CFG)


def test_missing_shards_and_pickles_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.pkl").write_bytes(pickle.dumps(1))
    with pytest.raises(UserError, match="pickle-based files are never loaded"):
        mtj_import.plan_mtj(tmp_path / "a", CFG)
    (tmp_path / "b" / "shard_0").mkdir(parents=True)
    (tmp_path / "b" / "shard_2").mkdir()
    with pytest.raises(IntegrityError, match="shard_0 … shard_1"):
        mtj_import.plan_mtj(tmp_path / "b", CFG)


def _flip_member_data(path: Path) -> str:
    """Flip one byte inside the data of the largest member of a stored .npz; returns its name."""
    with zipfile.ZipFile(path) as zf:
        info = max(zf.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.file_size - 5] ^= 0x40  # in the array, well past the .npy header
    path.write_bytes(bytes(data))
    return info.filename


def test_corrupt_member_data_names_the_file_and_the_member(tmp_path, slim, capsys):
    """A member whose data no longer matches its CRC (headers intact, so the plan passes): the
    error names the .npz file and the member, through the API and `star-engine convert`."""
    src = _copy(slim["float32"][0], tmp_path / "slim")
    piece = src / "shard_1" / "0.npz"
    member = _flip_member_data(piece)
    mtj_import.plan_mtj(src, CFG)  # every header is still fine
    with pytest.raises(IntegrityError, match=rf"{piece}:{member}: corrupt member data \(BadZipFile: Bad CRC-32"):
        _, leaves = mtj_import.iter_mtj_gptj(src, CFG)
        for _ in leaves:
            pass
    from star_engine.cli import main

    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({k: v for k, v in CFG.to_dict().items() if k != "dtype"}))
    dest = tmp_path / "new" / "parent" / "ck"
    assert main(["convert", "--from", "mtj", str(src), str(dest), "--config", str(cfg), "--byte-tokenizer"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {piece}:{member}: corrupt member data") and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()  # the parents the failed convert created are gone too


def test_huge_member_with_consistent_config_refused_before_allocation(tmp_path, monkeypatch):
    """A member whose header, zip sizes and config all agree on a size larger than the memory this
    process may use: refused (naming file and member) before the array is allocated."""
    from star_haiku_xmap.checkpoint import safeio

    config = GPTJConfig(n_layer=1, d_model=64, n_head=4, d_head=16, d_ff=256, rotary_dim=4, n_ctx=8, vocab=4096)
    CW.save_checkpoint(tmp_path / "native", jax.tree.map(np.asarray, model.init_params(config, 0)),
                      model_config=config.to_dict(), tokenizer=TOK)
    mtj_export.export_mtj(tmp_path / "native", tmp_path / "slim", shards=1)
    monkeypatch.setattr(safeio, "memory_available", lambda: 1 << 19)  # the embedding needs 1 MiB
    with pytest.raises(IntegrityError, match=r"\.npz:arr_\d+\.npy: needs 1048576 bytes, more than the 524288 bytes"):
        _, leaves = mtj_import.iter_mtj_gptj(tmp_path / "slim", config)
        for _ in leaves:
            pass
