"""``star-engine convert`` and loading onto a mesh: HF safetensors streamed tensor
by tensor (peak memory measured), pickles refused, per-mp-shard parts read only
where a device needs them (8 simulated devices, tracemalloc and peak-RSS bounds),
and GPT-J's tokenizer (a GPT-2-style byte-level BPE tokenizer.json with 50,257
tokens built here) against a vocabulary padded to 50,400."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import jax
import numpy as np
import pytest

from star_engine.cli import main
from star_engine.errors import UserError
from star_haiku_xmap.model import network as model
from star_haiku_xmap.model.config import GPTJConfig
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW

FIXTURE = Path(__file__).parent / "fixtures" / "gptj_tiny"


# ----------------------------------------------------------------------------- HF


def small_tokenizer_json(n: int = 90) -> str:
    """A word-level tokenizer.json of ``n`` tokens ending in ``<|endoftext|>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]"] + [f"w{i}" for i in range(n - 2)] + ["<|endoftext|>"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok.to_str()


def test_cli_hf_to_native_matches_golden_logits(tmp_path):
    with np.load(FIXTURE / "golden.npz", allow_pickle=False) as z:
        seq, want = z["seq_0"], z["logits_0"]
    (tmp_path / "tokenizer.json").write_text(small_tokenizer_json())
    rc = main(["convert", "--from", "hf", str(FIXTURE), str(tmp_path / "ck"), "--dtype", "float32",
               "--tokenizer-file", str(tmp_path / "tokenizer.json")])
    assert rc == 0
    params, m = C.load_checkpoint(tmp_path / "ck")
    config = GPTJConfig.from_dict(m["model_config"])
    got = np.asarray(model.forward(params, seq[None], config))[0]
    assert np.abs(got - want).max() <= 1e-4
    assert m["extra"]["source"] == "hf_gptj" and m["version"] == 1
    assert m["tokenizer"]["kind"] == "hf" and m["tokenizer"]["eos_id"] == 89


def test_cli_refuses_pickles_and_points_to_safetensors(tmp_path, capsys):
    class Boom:
        def __reduce__(self):
            return (os.system, ("echo unpickled > " + str(tmp_path / "pwned"),))

    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text((FIXTURE / "config.json").read_text())
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(Boom()))
    assert main(["convert", "--from", "hf", str(src), str(tmp_path / "out"), "--byte-tokenizer"]) == 2
    err = capsys.readouterr().err
    assert "pickle-based weights are never loaded" in err and "safetensors" in err
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()
    assert main(["convert", "--from", "hf", str(FIXTURE), str(tmp_path / "o2")]) == 2  # no tokenizer.json
    assert "no tokenizer.json in this Hugging Face folder; pass --tokenizer-file" in capsys.readouterr().err


def _hf_random_folder(dest: Path, n_layer=12, d=512, vocab=1024, files=3) -> tuple[int, int]:
    """An HF GPT-J folder of random fp32 tensors in ``files`` safetensors shards
    with an index; returns (total bytes, largest tensor bytes). Written one shard
    at a time."""
    from safetensors.numpy import save_file

    dest.mkdir()
    cfg = {"model_type": "gptj", "n_embd": d, "n_head": 8, "n_layer": n_layer, "rotary_dim": 16,
           "n_positions": 64, "vocab_size": vocab, "n_inner": None, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}
    (dest / "config.json").write_text(json.dumps(cfg))
    shapes = {"transformer.wte.weight": (vocab, d), "transformer.ln_f.weight": (d,), "transformer.ln_f.bias": (d,),
              "lm_head.weight": (vocab, d), "lm_head.bias": (vocab,)}
    for i in range(n_layer):
        h = f"transformer.h.{i}."
        shapes.update({h + "ln_1.weight": (d,), h + "ln_1.bias": (d,), h + "mlp.fc_in.weight": (4 * d, d),
                       h + "mlp.fc_in.bias": (4 * d,), h + "mlp.fc_out.weight": (d, 4 * d), h + "mlp.fc_out.bias": (d,)})
        for p in ("q", "k", "v", "out"):
            shapes[h + f"attn.{p}_proj.weight"] = (d, d)
    names = sorted(shapes)
    rng = np.random.default_rng(0)
    weight_map = {}
    for k in range(files):
        part = names[k::files]
        fname = f"model-{k:05d}-of-{files:05d}.safetensors"
        save_file({n: rng.standard_normal(shapes[n], dtype=np.float32) * 0.02 for n in part}, str(dest / fname))
        weight_map.update({n: fname for n in part})
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    sizes = [int(np.prod(s)) * 4 for s in shapes.values()]
    return sum(sizes), max(sizes)


def test_hf_sharded_conversion_streams_tensor_by_tensor(tmp_path):
    total, largest = _hf_random_folder(tmp_path / "hf")
    assert total > 30 * largest  # a model large enough for the bound to mean something
    tracemalloc.start()
    try:
        rc = main(["convert", "--from", "hf", str(tmp_path / "hf"), str(tmp_path / "ck"), "--dtype", "float32",
                   "--byte-tokenizer", "--mp", "4"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rc == 0
    assert peak < 4 * largest + (8 << 20), f"peak {peak / 2**20:.1f} MiB for a {total / 2**20:.0f} MiB model"
    m = C.read_manifest(tmp_path / "ck")
    assert m["mp_split"] == 4 and sum("parts" in e for e in m["leaves"]) == 12 * 7 + 3


# ----------------------------------------------------------------------------- loading onto a mesh

_LOAD_SCRIPT = textwrap.dedent("""
    import json, resource, sys, tracemalloc
    import jax, numpy as np
    from star_haiku_xmap import model, sharding
    from star_haiku_xmap.checkpoint import format as C
    from star_haiku_xmap.model.config import GPTJConfig

    path, mesh_dp, mesh_mp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    m = C.read_manifest(path)
    config = GPTJConfig.from_dict(m["model_config"])
    mesh = sharding.make_mesh({"dp": mesh_dp, "mp": mesh_mp})
    shapes = jax.eval_shape(lambda k: model.init_params(config, k), jax.random.key(0))
    sh = sharding.tree_shardings(shapes, mesh)
    reads = []
    real = C.read_zstd_part
    C.read_zstd_part = lambda p, **kw: (reads.append(str(p)), real(p, **kw))[1]
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    params, _ = C.load_checkpoint(path, shardings=sh)  # the real path, end to end
    _, peak = tracemalloc.get_traced_memory()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    C.read_zstd_part = real
    # Per leaf, what loading it adds on top of what is already held (a CPU device
    # keeps the source buffer of its latest transfer until its next one, so up to
    # one block per device lingers from earlier leaves).
    leaf_peak = 0
    for leaf in m["leaves"]:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        x = C.load_leaf_sharded(path, leaf, C._get_path(sh, tuple(leaf["path"]), "shardings"))
        leaf_peak = max(leaf_peak, tracemalloc.get_traced_memory()[1] - base)
        del x
    tracemalloc.stop()
    # every device holds exactly its slice of the stored values
    leaf = next(e for e in m["leaves"] if e["path"] == ["h_0/mlp/fc_in", "w"])
    full = C.read_leaf(path, leaf)
    arr = params["h_0/mlp/fc_in"]["w"]
    ok = all(np.array_equal(np.asarray(s.data), full[s.index]) for s in arr.addressable_shards)
    device_bytes = sum(s.data.nbytes for x in jax.tree.leaves(params) for s in x.addressable_shards)
    print(json.dumps({"peak": peak, "leaf_peak": leaf_peak, "rss_growth": rss - base_rss,
                      "device_bytes": device_bytes, "ok": ok, "reads": len(reads), "distinct": len(set(reads)),
                      "spec": str(arr.sharding.spec), "n_devices": len(arr.addressable_shards)}))
""")

BIG = GPTJConfig(n_layer=4, d_model=1024, n_head=16, d_head=64, d_ff=4096, rotary_dim=16, n_ctx=64, vocab=4096)


def _random_leaves(config: GPTJConfig):
    rng = np.random.default_rng(0)
    for key_path, (shape, _) in sorted(C.param_specs(config.to_dict()).items()):
        yield key_path, (rng.standard_normal(shape, dtype=np.float32) * 0.02)


def _load_in_subprocess(path: Path, dp: int, mp: int) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, str(path), str(dp), str(mp)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_mesh_loading_reads_only_each_devices_slice(tmp_path):
    """8 simulated devices (dp 2 x mp 4): an mp-split checkpoint's parts are each
    decompressed once and never the whole leaf; host staging memory stays near one
    part, an unsplit checkpoint's near one leaf, both far below the model."""
    specs = C.param_specs(BIG.to_dict())
    model_bytes = sum(int(np.prod(s)) * 4 for s, _ in specs.values())
    largest = max(int(np.prod(s)) * 4 for s, _ in specs.values())
    tok = {"kind": "byte", "vocab_size": 257, "eos_id": 256}
    CW.write_checkpoint(tmp_path / "split", _random_leaves(BIG), model_config=BIG.to_dict(), tokenizer=tok, mp_split=4)
    CW.write_checkpoint(tmp_path / "whole", _random_leaves(BIG), model_config=BIG.to_dict(), tokenizer=tok)
    n_files = sum(len(C.part_files(e)) for e in C.read_manifest(tmp_path / "split")["leaves"])

    split = _load_in_subprocess(tmp_path / "split", 2, 4)
    assert split["ok"] and split["spec"] in ("P(None, 'mp')", "PartitionSpec(None, 'mp')") and split["n_devices"] == 8
    assert split["reads"] == split["distinct"] == n_files  # every part decompressed exactly once
    # Staging: the blocks of at most one leaf (the runtime frees a transfer's source
    # buffer only at that device's next transfer) plus the part being decompressed.
    part = largest / 4
    assert split["leaf_peak"] <= largest + 2 * part + (1 << 20), split
    assert split["peak"] <= largest + 2 * part + (2 << 20), split  # about 11% of the model here
    # device buffers (host RAM on CPU: the model once per dp replica) plus a little staging
    assert split["device_bytes"] >= 2 * model_bytes * 0.98
    assert split["rss_growth"] < split["device_bytes"] + 2 * largest + (64 << 20), split

    whole = _load_in_subprocess(tmp_path / "whole", 2, 4)
    assert whole["ok"] and whole["reads"] == whole["distinct"] == len(specs)
    assert largest <= whole["leaf_peak"] <= 2 * largest + (1 << 20), whole  # one whole leaf, never the model
    assert whole["peak"] <= 3 * largest + (2 << 20), whole
    assert whole["rss_growth"] < whole["device_bytes"] + 3 * largest + (64 << 20), whole


# ----------------------------------------------------------------------------- GPT-J's tokenizer


def gpt2_style_tokenizer_json() -> str:
    """A byte-level BPE tokenizer.json shaped like GPT-2's/GPT-J's: 256 byte tokens,
    50,000 merges, then ``<|endoftext|>`` = 50256 (50,257 tokens in all)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # byte order as GPT-2: printable ASCII first
    order = sorted(alphabet, key=lambda c: (not c.isascii() or not c.isprintable(), c))
    vocab = {c: i for i, c in enumerate(order)}
    common = [c for c in "Ġetaoinshrdlucmfwypvbgkjqxz" + "ETAOINSHRDLUCMFWYPVBGKJQXZ.,:()?!0123456789'\"-"]
    pairs = [(a, b) for a in common for b in common] + [(a, b) for a in order for b in order]
    merges, seen = [], set(vocab)
    for a, b in pairs:
        if len(merges) == 50000:
            break
        if a + b not in seen:
            seen.add(a + b)
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return tok.to_str()


@pytest.fixture(scope="module")
def gptj_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(gpt2_style_tokenizer_json())
    return path


def test_gptj_tokenizer_padding_eos_and_loss_boundary(tmp_path, gptj_tokenizer):
    from star_engine.api import GenRequest, GenSpec
    from star_haiku_xmap.plugin import HaikuXmapBackend
    from star_haiku_xmap.tokenizer import HFTokenizer
    from star_haiku_xmap.train.trainer import encode_example

    tok = HFTokenizer(gptj_tokenizer)
    assert (tok.vocab_size, tok.eos_id, tok.pad_id) == (50257, 50256, 50256)
    # "<|endoftext|>" inside data is text, never the control token
    assert 50256 not in tok.encode("a <|endoftext|> b")

    # a GPT-J-shaped vocabulary: 50,257 real rows padded to 50,400, padding rows made attractive
    cfg = GPTJConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_ff=64, rotary_dim=4, n_ctx=64, vocab=50400)
    params = jax.tree.map(np.asarray, model.init_params(cfg, 0))
    params["lm_head"]["b"] = params["lm_head"]["b"].copy()
    params["lm_head"]["b"][50257:] = 100.0  # argmax would pick padding ids if they were allowed
    CW.save_checkpoint(tmp_path / "base", params, model_config=cfg.to_dict(), tokenizer={"kind": "byte",
                      "vocab_size": 257, "eos_id": 256})
    assert main(["convert", "--from", "native", str(tmp_path / "base"), str(tmp_path / "ck"),
                 "--tokenizer-file", str(gptj_tokenizer)]) == 0
    stored = C.read_manifest(tmp_path / "ck")["tokenizer"]
    assert stored["kind"] == "hf" and stored["vocab_size"] == 50257 and stored["eos_id"] == 50256

    backend = HaikuXmapBackend.from_table(checkpoint_path=str(tmp_path / "ck"), tokenizer="hf")
    out = backend.generate(str(tmp_path / "ck"), [GenRequest(prompt="Q: what? A:", seed=1)],
                           GenSpec(max_new_tokens=6, temperature=0.0, top_p=1.0, batch_size=1, stop=()))
    assert isinstance(out[0], str)
    import star_haiku_xmap.sampling.static as sample_mod

    # the same greedy step without the vocabulary limit would emit a padding id
    logits = model.forward(params, np.asarray([tok.encode("Q: what? A:")], np.int32), cfg)[0, -1]
    assert int(np.argmax(logits)) >= 50257
    assert sample_mod.trim([50300, 5, 50256, 7], 50256) == [50300, 5]
    assert tok.decode([50300, 50256] + tok.encode(" hi")) == " hi"  # padding and eos dropped

    # the masked-loss boundary: prompt and completion tokenised apart, loss on completion + eos
    prompt, completion = "Q: Where? Answer Choices: (a) x\nA:", " The answer is x (a)."
    enc = encode_example(tok, prompt, completion, seq_len=64)
    p_ids, c_ids = tok.encode(prompt), tok.encode(completion)
    assert list(enc.ids) == p_ids + c_ids + [50256] and enc.n_prompt == len(p_ids)
    assert tok.decode(enc.ids[enc.n_prompt:].tolist()) == completion

    # a model vocabulary smaller than the tokenizer's is refused
    small = tmp_path / "small"
    CW.save_checkpoint(small, jax.tree.map(np.asarray, model.init_params(cfg.replace(vocab=50256), 0)),
                      model_config=cfg.replace(vocab=50256).to_dict(), tokenizer={"kind": "byte", "vocab_size": 257,
                                                                              "eos_id": 256})
    with pytest.raises(UserError, match="more than the model's vocab 50256"):
        from star_haiku_xmap.convert.commands import ConvertCommand
        import argparse

        p = argparse.ArgumentParser()
        ConvertCommand().add_arguments(p)
        ConvertCommand().run(p.parse_args(["--from", "native", str(small), str(tmp_path / "x"),
                                           "--tokenizer-file", str(gptj_tokenizer)]))
