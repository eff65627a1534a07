"""HF GPT-J import: logits and greedy parity against golden HF outputs, sharded
safetensors, native conversion, and hostile weight files. No torch needed: the
golden outputs were recorded by scripts/make_parity_fixture.py."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from star_engine.errors import IntegrityError, UserError
from star_haiku_xmap import inference
from star_haiku_xmap.model import network as model
from star_haiku_xmap.sampling import static as sample
from star_haiku_xmap.convert import hf_import
from star_haiku_xmap.checkpoint.safeio import read_safetensors_header

FIXTURE = Path(__file__).parent / "fixtures" / "gptj_tiny"
TOL = 1e-4


@pytest.fixture(scope="module")
def golden():
    with np.load(FIXTURE / "golden.npz", allow_pickle=False) as z:
        return dict(z)


@pytest.fixture(scope="module")
def imported():
    return hf_import.import_hf_gptj(FIXTURE)


def test_config_mapping(imported):
    config, params = imported
    assert (config.n_layer, config.d_model, config.n_head, config.d_head, config.d_ff, config.rotary_dim,
            config.n_ctx, config.vocab, config.dtype) == (2, 64, 4, 16, 256, 8, 64, 96, "float32")
    assert params["h_1/attn/q"]["w"].shape == (64, 64) and params["h_0/mlp/fc_in"]["w"].shape == (64, 256)
    assert params["lm_head"]["w"].shape == (64, 96) and params["wte"]["embeddings"].shape == (96, 64)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    # LayerNorm and biases were perturbed in the fixture, so parity depends on them.
    assert np.abs(params["h_0/ln"]["scale"] - 1).max() > 0.1 and np.abs(params["lm_head"]["b"]).max() > 0.1


def test_logits_parity(imported, golden):
    config, params = imported
    for i in range(3):
        seq, want = golden[f"seq_{i}"], golden[f"logits_{i}"]
        got = np.asarray(model.forward(params, seq[None], config))[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= TOL, f"sequence {i}: max |diff| {np.abs(got - want).max()}"


def test_greedy_parity_with_sampler(imported, golden):
    config, params = imported
    n_new = golden["gen_tokens_0"].shape[0]
    cases = [(golden[f"gen_prompt_{i}"][None], np.ones((1, golden[f"gen_prompt_{i}"].size), bool),
              golden[f"gen_tokens_{i}"][None]) for i in range(2)]
    cases.append((golden["batch_prompt"], golden["batch_mask"].astype(bool), golden["batch_tokens"]))
    for tokens, mask, want in cases:
        keys = sample.keys_from_seeds(range(tokens.shape[0]))
        # eos_id -1: HF generated a fixed number of tokens without stopping.
        got = sample.generate(params, tokens, mask, keys, 0.0, 1.0, config=config, max_new_tokens=n_new, eos_id=-1)
        np.testing.assert_array_equal(np.asarray(got), want)
    assert float(golden["min_margin"]) > 10 * TOL  # greedy parity is not decided by a near-tie


def test_sharded_safetensors_import(tmp_path, imported):
    from safetensors import safe_open

    src = tmp_path / "sharded"
    src.mkdir()
    shutil.copy(FIXTURE / "config.json", src)
    with safe_open(str(FIXTURE / "model.safetensors"), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    names = sorted(tensors)
    weight_map = {}
    for part, chunk in enumerate((names[::2], names[1::2])):
        fname = f"model-{part + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in chunk}, str(src / fname))
        weight_map.update({k: fname for k in chunk})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config, params = hf_import.import_hf_gptj(src)
    assert config == imported[0]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(imported[1])):
        np.testing.assert_array_equal(a, b)
    weight_map[names[1]] = "model-00001-of-00002.safetensors"  # index disagrees with the files
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(IntegrityError, match="not mapped to this file"):
        hf_import.import_hf_gptj(src)
    weight_map[names[1]] = "../../escape.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(IntegrityError, match="bad shard file name"):
        hf_import.import_hf_gptj(src)


def test_convert_to_native_and_user_helpers(tmp_path, golden):
    from star_haiku_xmap.checkpoint.format import manifest_sha256

    tok = {"kind": "byte", "vocab_size": 257, "eos_id": 256}
    m = hf_import.convert_hf_gptj(FIXTURE, tmp_path / "native", tokenizer=tok)
    assert m["extra"]["source"] == "hf_gptj" and len(m["leaves"]) == 2 * 10 + 5
    loaded = inference.load_model(tmp_path / "native")
    assert loaded[0].vocab == 96 and loaded[2].to_dict() == tok
    seq = golden["seq_1"]
    np.testing.assert_allclose(inference.logits(tmp_path / "native", seq.tolist()), golden["logits_1"], atol=TOL)
    batch = np.stack([seq, seq[::-1]])
    out = inference.logits(loaded, batch)
    assert out.shape == (2, seq.size, 96) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], golden["logits_1"], atol=TOL)
    assert inference.load_model(FIXTURE)[2] is None  # HF folder without tokenizer.json
    with pytest.raises(UserError, match=r"token ids must lie in \[0, 96\)"):
        inference.logits(loaded, [1, 96])
    with pytest.raises(UserError, match="exceed the model's context"):
        inference.logits(loaded, [1] * 65)
    hf_import.convert_hf_gptj(FIXTURE, tmp_path / "again", tokenizer=tok)
    assert manifest_sha256(tmp_path / "native") == manifest_sha256(tmp_path / "again")


def test_bf16_import(golden):
    config, params = hf_import.import_hf_gptj(FIXTURE, dtype="bfloat16")
    assert config.dtype == "bfloat16"
    assert {x.dtype.name for x in jax.tree.leaves(params)} == {"bfloat16"}
    got = np.asarray(model.forward(params, golden["seq_1"][None], config))[0]
    assert np.abs(got - golden["logits_1"]).max() < 0.25  # bf16 activations: close, not exact


# ----------------------------------------------------------------------------- hostile inputs


def write_raw_safetensors(path: Path, header: dict, data: bytes, header_len: int | None = None):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if header_len is None else header_len) + h + data)


@pytest.mark.parametrize("case,message", [
    ("huge_header", "header length"),
    ("not_json", "not valid JSON"),
    ("overlap", "overlaps"),
    ("out_of_range", "outside the data section"),
    ("dtype_shape", "needs 16 bytes, data_offsets span 12"),
    ("bad_dtype", "unsupported dtype"),
    ("gap", "unaccounted bytes"),
])
def test_bad_safetensors_headers(tmp_path, case, message):
    p = tmp_path / "model.safetensors"
    a = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    if case == "huge_header":
        write_raw_safetensors(p, {"a": a}, b"\0" * 16, header_len=1 << 40)
    elif case == "not_json":
        p.write_bytes(struct.pack("<Q", 5) + b"{nope" + b"\0" * 16)
    elif case == "overlap":
        write_raw_safetensors(p, {"a": a, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16)
    elif case == "out_of_range":
        write_raw_safetensors(p, {"a": {**a, "data_offsets": [0, 1 << 33]}}, b"\0" * 16)
    elif case == "dtype_shape":
        write_raw_safetensors(p, {"a": {**a, "data_offsets": [0, 12]}}, b"\0" * 12)
    elif case == "bad_dtype":
        write_raw_safetensors(p, {"a": {**a, "dtype": "F8_E9"}}, b"\0" * 16)
    elif case == "gap":
        write_raw_safetensors(p, {"a": {**a, "data_offsets": [4, 20]}}, b"\0" * 20)
    with pytest.raises(IntegrityError, match=message) as err:
        read_safetensors_header(p)
    assert str(p) in str(err.value)


def test_bad_header_refused_by_importer_before_reading(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(FIXTURE / "config.json", src)
    write_raw_safetensors(src / "model.safetensors", {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}},
                          b"\0" * 8)
    with pytest.raises(IntegrityError, match="model.safetensors.*needs 16 bytes"):
        hf_import.import_hf_gptj(src)


class _Boom:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(_Boom.marker),))


def test_pickle_weights_refused_and_never_unpickled(tmp_path):
    _Boom.marker = str(tmp_path / "pwned")
    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(FIXTURE / "config.json", src)
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(UserError, match="pickle-based weights are never loaded.*safetensors"):
        hf_import.import_hf_gptj(src)
    with pytest.raises(UserError, match="safetensors"):
        hf_import.import_hf_gptj(src / "pytorch_model.bin")
    with pytest.raises(UserError, match="safetensors"):
        inference.load_model(src / "pytorch_model.bin")
    assert not (tmp_path / "pwned").exists()
    pickle.loads((src / "pytorch_model.bin").read_bytes())  # the payload was live all along
    assert (tmp_path / "pwned").exists()


def test_config_and_tensor_mismatches(tmp_path):
    src = tmp_path / "m"
    shutil.copytree(FIXTURE, src)
    cfg = json.loads((src / "config.json").read_text())

    def with_config(**changes):
        (src / "config.json").write_text(json.dumps({**cfg, **changes}))

    with_config(model_type="gpt2")
    with pytest.raises(UserError, match="model_type is 'gpt2'"):
        hf_import.import_hf_gptj(src)
    with_config(activation_function="relu")
    with pytest.raises(UserError, match="activation_function 'relu'"):
        hf_import.import_hf_gptj(src)
    with_config(n_embd=128)
    with pytest.raises(UserError, match=r"transformer.h.0.attn.k_proj.weight' has shape \[64, 64\]"):
        hf_import.import_hf_gptj(src)
    with_config(n_layer=3)
    with pytest.raises(UserError, match="'transformer.h.2.attn.k_proj.weight' missing"):
        hf_import.import_hf_gptj(src)
    with_config(n_layer=1)
    with pytest.raises(UserError, match="unexpected tensors.*transformer.h.1"):
        hf_import.import_hf_gptj(src)
