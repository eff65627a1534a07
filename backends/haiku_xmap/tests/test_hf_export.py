"""``star-engine convert --to hf`` (convert/hf_export.py): native checkpoints of the four
architectures (the tiny random HF fixtures imported, and one fine-tuned by the backend's
``train`` first) written as Hugging Face folders.

Without torch: the export re-imported through ``convert --from hf`` gives back every
parameter bit for bit (fp32 and bf16, unsplit and mp-split sources, sharded output),
config.json's fields, the index of a sharded export, the tokenizer files (the byte
tokenizer's equivalent tokenizer.json), bounded memory, and the refusals (an existing
destination, an unknown architecture, bad options), with nothing left behind by a
failed export. With transformers (skipped without it): ``AutoModelForCausalLM`` and
``AutoTokenizer`` on the exported folder give the engine's logits (fp32, within 1e-4)
and the engine's greedy text."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path

import jax
import numpy as np
import pytest

from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
from star_engine.cli import main
from star_haiku_xmap import inference
from star_haiku_xmap.model import network as model
from star_haiku_xmap.model.config import PRESETS, GPTJConfig, config_from_dict
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.convert import hf_export, hf_import, hf_llama
from star_haiku_xmap.checkpoint.safeio import CHUNK, read_safetensors_header
from star_haiku_xmap.tokenizer import ByteTokenizer, HFTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = ("gptj", "llama", "qwen2", "mistral")
TOL = 1e-4
# Each prompt's 16 greedy steps lead by at least 5e-3 (top-1 over top-2) in every model here.
PROMPTS = ["Q: What is 12 + 7?\nA:", "The sky is", "1, 2, 3,", "x = ", "Let's think step by step."]
HF_CLASS = {"gptj": "GPTJForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}


def tokenizer_json() -> str:
    """A byte-level BPE of 96 tokens (the fixtures' vocabulary): newline and the printable
    ASCII bytes 32..125, no merges, then ``<|endoftext|>`` = 95, the fixtures' eos id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    table = hf_export._bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: i for i, b in enumerate([10, *range(32, 126)])}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok.to_str()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hf_export")


@pytest.fixture(scope="module")
def tok_file(root) -> Path:
    path = root / "tokenizer.json"
    path.write_text(tokenizer_json())
    return path


@pytest.fixture(scope="module")
def imported(root, tok_file) -> dict[str, Path]:
    """Each fixture imported (fp32) with the test tokenizer: {family: native checkpoint}."""
    out = {}
    for family in FAMILIES:
        out[family] = root / f"{family}_ck"
        hf_import.convert_hf(FIXTURES / f"{family}_tiny", out[family], dtype="float32",
                             tokenizer=HFTokenizer(tok_file).to_dict())
    return out


@pytest.fixture(scope="module")
def finetuned(root, imported) -> Path:
    """The Qwen2 import (tied embeddings, q/k/v biases) fine-tuned for 3 steps by the backend,
    as a run does: fp32 master weights in a checkpoint of the run's format."""
    from star_haiku_xmap.plugin import HaikuXmapBackend

    backend = HaikuXmapBackend.from_table(checkpoint_path=str(imported["qwen2"]), mesh={"dp": 1, "mp": 1}, dtype="float32")
    examples = [TrainExample(f"Q: What is {a} + {b}?\nA:", f" {a} plus {b} is {a + b}. The answer is {a + b}.")
                for a in range(6) for b in range(4)]
    spec = TrainSpec(steps=3, batch_size=4, grad_accum=1, seed=0, optimizer={"lr": 1e-2, "warmup_steps": 0})
    out = root / "qwen2_finetuned"
    backend.train(str(imported["qwen2"]), out, examples, spec)
    before = dict(C.native_leaves(imported["qwen2"])[1])
    after = dict(C.native_leaves(out)[1])
    assert C.read_manifest(out)["extra"]["kind"] == "finetune"
    assert all(np.abs(after[k] - before[k]).max() > 1e-3 for k in before)  # every tensor moved
    return out


def export(src: Path, dest: Path, *args: str) -> None:
    assert main(["convert", "--to", "hf", str(src), str(dest), *args]) == 0


def same_leaves(a: Path, b: Path, dtype: str | None = None) -> None:
    ma, la = C.native_leaves(a, dtype)
    mb, lb = C.native_leaves(b)
    assert config_from_dict(ma["model_config"]).replace(dtype=dtype or "float32") == \
        config_from_dict(mb["model_config"])
    got = dict(lb)
    for key, want in la:
        assert got[key].dtype == want.dtype and got[key].shape == want.shape
        assert got[key].tobytes() == want.tobytes(), f"{'/'.join(key)} differs"
    assert len(got) == len(ma["leaves"])


# ----------------------------------------------------------------------------- without torch


@pytest.mark.parametrize("family", [*FAMILIES, "finetuned"])
def test_reimport_is_bit_identical(family, root, imported, finetuned, capsys):
    src = finetuned if family == "finetuned" else imported[family]
    dest = root / f"export_{family}"
    export(src, dest)
    assert f"wrote {dest} (Hugging Face" in capsys.readouterr().out
    back = root / f"reimport_{family}"
    assert main(["convert", "--from", "hf", str(dest), str(back), "--dtype", "float32"]) == 0
    same_leaves(src, back)
    tok = C.read_manifest(back)["tokenizer"]
    assert {k: tok[k] for k in ("sha256", "eos_id", "eos_token", "vocab_size")} == \
        {k: C.read_manifest(src)["tokenizer"][k] for k in ("sha256", "eos_id", "eos_token", "vocab_size")}


def test_bf16_export_and_split_source(root, imported):
    src = imported["llama"]
    export(src, root / "bf16", "--dtype", "bfloat16")
    tensors, metadata = read_safetensors_header(root / "bf16" / "model.safetensors")
    assert metadata == {"format": "pt"} and {t.dtype for t in tensors.values()} == {"bfloat16"}
    assert json.loads((root / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert main(["convert", "--from", "hf", str(root / "bf16"), str(root / "bf16_back"), "--dtype", "bfloat16"]) == 0
    same_leaves(src, root / "bf16_back", "bfloat16")  # the cast is the engine's own, round to nearest even
    # A checkpoint stored as mp parts (a run on an mp = 2 mesh) exports to the same bytes.
    assert main(["convert", "--from", "native", str(src), str(root / "split"), "--mp", "2"]) == 0
    assert C.read_manifest(root / "split")["version"] == C.VERSION_SPLIT
    export(root / "split", root / "from_split")
    export(src, root / "from_whole")
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (root / "from_split" / name).read_bytes() == (root / "from_whole" / name).read_bytes()


def test_config_json_generation_and_tokenizer_files(root, imported):
    for family in FAMILIES:
        dest = root / f"cfg_{family}"
        export(imported[family], dest)
        cfg = json.loads((dest / "config.json").read_text())
        config = config_from_dict(C.read_manifest(imported[family])["model_config"])
        assert cfg["model_type"] == family and cfg["architectures"] == [HF_CLASS[family]]
        bos = 95 if family == "gptj" else None  # GPT-J's is its end-of-text; no Llama-style one in this vocabulary
        assert (cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (96, bos, 95, 95)
        assert cfg["torch_dtype"] == cfg["dtype"] == "float32" and cfg["initializer_range"] == 0.02
        # The importer reads back exactly the engine's config.
        if family == "gptj":
            assert hf_import.hf_config_to_gptj(cfg) == config
            assert (cfg["n_inner"], cfg["rotary_dim"], cfg["activation_function"], cfg["tie_word_embeddings"]) == \
                (256, 8, "gelu_new", False)
        else:
            assert hf_llama.config_from_hf(cfg) == config
            for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                        "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_dropout"):
                assert key in cfg, f"{family}: {key} not written"
        tensors, metadata = read_safetensors_header(dest / "model.safetensors")
        assert metadata == {"format": "pt"}
        assert ("lm_head.weight" in tensors) == (family != "qwen2")  # Qwen2's head is tied: not stored
        assert json.loads((dest / "generation_config.json").read_text()) == \
            {"bos_token_id": bos, "eos_token_id": 95, "pad_token_id": 95}
        tc = json.loads((dest / "tokenizer_config.json").read_text())
        assert (tc["tokenizer_class"], tc["eos_token"], tc["pad_token"], tc["model_max_length"]) == \
            ("PreTrainedTokenizerFast", "<|endoftext|>", "<|endoftext|>", 64)
        assert tc["bos_token"] == (None if bos is None else "<|endoftext|>")
        assert (dest / "tokenizer.json").read_text() == tokenizer_json()
        assert not (dest / "model.safetensors.index.json").exists()
    llama, qwen, mistral = (json.loads((root / f"cfg_{f}" / "config.json").read_text())
                            for f in ("llama", "qwen2", "mistral"))
    assert llama["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    assert (llama["attention_bias"], llama["mlp_bias"], llama["rope_theta"]) == (False, False, 500000.0)
    assert (qwen["tie_word_embeddings"], qwen["use_sliding_window"], qwen["sliding_window"], qwen["layer_types"]) == \
        (True, False, None, ["full_attention"] * 2)
    assert (mistral["sliding_window"], mistral["rope_scaling"]) == (8, None)
    # A Qwen2 model with a window on every layer says so in both spellings, and reads back.
    windowed = config_from_dict(C.read_manifest(imported["qwen2"])["model_config"]).replace(sliding_window=8)
    cfg = hf_export.hf_config(windowed, "float32", {"bos": None, "eos": 95, "pad": 95}, "x")
    assert (cfg["use_sliding_window"], cfg["max_window_layers"], cfg["layer_types"]) == \
        (True, 0, ["sliding_attention"] * 2)
    assert hf_llama.config_from_hf(cfg) == windowed


def test_sharded_export_and_its_index(root, imported):
    src, dest = imported["llama"], root / "sharded"
    export(src, dest, "--max-shard-size", "100KB")
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in dest.glob("*.safetensors"))
    n = len(files)
    assert n > 2 and files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert set(index["weight_map"].values()) == set(files)
    sizes = {}
    for f in files:
        tensors, metadata = read_safetensors_header(dest / f)
        assert metadata == {"format": "pt"} and all(index["weight_map"][t] == f for t in tensors)
        sizes[f] = sum(t.end - t.start for t in tensors.values())
        assert sizes[f] <= 100_000 or len(tensors) == 1  # a tensor larger than a shard goes alone
    assert index["metadata"]["total_size"] == sum(sizes.values()) == 394496
    assert len(index["weight_map"]) == 21
    assert main(["convert", "--from", "hf", str(dest), str(root / "sharded_back"), "--dtype", "float32"]) == 0
    same_leaves(src, root / "sharded_back")
    assert [hf_export.parse_size(s) for s in ("5GB", "500MiB", "1000", "1.5kb")] == [5 * 10**9, 500 << 20, 1000, 1500]


def test_byte_tokenizer_is_written_as_an_equivalent_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer

    cfg = PRESETS["tiny"].replace(n_layer=1)
    CW.save_checkpoint(tmp_path / "ck", model.init_params(cfg, 0), model_config=cfg.to_dict(),
                       tokenizer=ByteTokenizer().to_dict())
    export(tmp_path / "ck", tmp_path / "hf")
    hf = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    byte = ByteTokenizer()
    for text in ["hello world", "  x\n\ty", "héllo ✓ 日本", "", "Q: 2+3?\nA: 5"]:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == byte.encode(text) and hf.decode(ids) == byte.decode(ids) == text
    assert hf.decode([104, 105, 256, 0xE2, 0x9C]) == byte.decode([104, 105, 256, 0xE2, 0x9C])  # partial UTF-8
    assert hf.token_to_id("<|endoftext|>") == 256 and hf.get_vocab_size() == 257
    tc = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (tc["eos_token"], tc["bos_token"], tc["model_max_length"]) == ("<|endoftext|>", "<|endoftext|>", 512)
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    # The vocabulary's 7 padding rows are never generated, as the engine masks them (valid_vocab).
    assert gen == {"bos_token_id": 256, "eos_token_id": 256, "pad_token_id": 256,
                   "suppress_tokens": list(range(257, 264))}


def test_tokenizer_stored_by_path_only(root, imported, tok_file, tmp_path, capsys):
    """A tokenizer.json too large to be stored inline is read from its path (sha256 checked)."""
    src = tmp_path / "ck"
    shutil.copytree(imported["gptj"], src)
    m = C.read_manifest(src)
    moved = tmp_path / "elsewhere.json"
    shutil.copy(tok_file, moved)
    m["tokenizer"] = {k: v for k, v in HFTokenizer(moved).to_dict().items() if k != "json"}
    (src / C.MANIFEST).write_bytes(CW.manifest_bytes(m))
    export(src, tmp_path / "ok")
    assert (tmp_path / "ok" / "tokenizer.json").read_text() == tok_file.read_text()
    moved.unlink()
    assert main(["convert", "--to", "hf", str(src), str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tokenizer-file" in err and str(moved) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "no").exists()
    export(src, tmp_path / "given", "--tokenizer-file", str(tok_file))
    assert (tmp_path / "given" / "tokenizer.json").read_text() == tok_file.read_text()


def test_beginning_of_text_token(root, imported, tmp_path):
    """Llama 3's ``<|begin_of_text|>`` (or Llama 2's ``<s>``) is named when the vocabulary has it."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(tokenizer_json())
    tok.add_special_tokens([AddedToken("<|begin_of_text|>", special=True, normalized=False)])
    (tmp_path / "tokenizer.json").write_text(tok.to_str())
    config = config_from_dict(C.read_manifest(imported["llama"])["model_config"]).replace(vocab=97)
    _, tc, ids = hf_export.tokenizer_files(HFTokenizer(tmp_path / "tokenizer.json").to_dict(), config, "x")
    assert (tc["bos_token"], ids["bos"], ids["eos"], ids["vocab"]) == ("<|begin_of_text|>", 96, 95, 97)


def test_bounded_memory_one_tensor_at_a_time(tmp_path):
    cfg = GPTJConfig(n_layer=8, d_model=256, n_head=8, d_head=32, d_ff=1024, rotary_dim=16, n_ctx=64, vocab=512)
    params = jax.tree.map(np.asarray, model.init_params(cfg, 0))
    largest = max(x.nbytes for x in jax.tree.leaves(params))
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    CW.save_checkpoint(tmp_path / "ck", params, model_config=cfg.to_dict(), tokenizer=ByteTokenizer().to_dict())
    del params
    tracemalloc.start()
    try:
        hf_export.export_hf(tmp_path / "ck", tmp_path / "hf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The one leaf read (and the reader's 4 MiB buffer), a block being converted: not the model.
    assert total > 20 * largest and peak < 2 * largest + CHUNK + (1 << 20), (peak, largest, total)


def test_refuses_an_existing_destination(root, imported, tmp_path, capsys):
    for dest in (tmp_path / "empty_dir", tmp_path / "a_file"):
        dest.mkdir() if dest.name == "empty_dir" else dest.write_text("keep me")
        before = sorted(p.name for p in tmp_path.iterdir())
        assert main(["convert", "--to", "hf", str(imported["llama"]), str(dest)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(dest) in err and "exists" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temporary
    assert (tmp_path / "a_file").read_text() == "keep me" and not any((tmp_path / "empty_dir").iterdir())


def test_unknown_architecture_is_refused_by_name(root, imported, tmp_path, capsys):
    src = tmp_path / "ck"
    shutil.copytree(imported["llama"], src)
    m = C.read_manifest(src)
    m["model_config"]["architecture"] = "mamba"
    (src / C.MANIFEST).write_bytes(CW.manifest_bytes(m))
    assert main(["convert", "--to", "hf", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(src / C.MANIFEST) in err and "'mamba'" in err
    assert not (tmp_path / "out").exists()
    # GPT-J whose heads do not make d_model has no HF equivalent; a folder that is no checkpoint is named too.
    cfg = GPTJConfig(n_layer=1, d_model=64, n_head=4, d_head=8, d_ff=64, rotary_dim=8, n_ctx=16, vocab=264)
    CW.save_checkpoint(tmp_path / "odd", model.init_params(cfg, 0), model_config=cfg.to_dict(),
                       tokenizer=ByteTokenizer().to_dict())
    assert main(["convert", "--to", "hf", str(tmp_path / "odd"), str(tmp_path / "out")]) == 2
    assert "no Hugging Face equivalent" in capsys.readouterr().err
    assert main(["convert", "--to", "hf", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "not a checkpoint" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_lora_checkpoint_exports_merged_into_its_base(tok_file, tmp_path, capsys):
    """LoRA adapters (a stage of the backend over the imported Llama) export as the merged
    model W + s A B; re-imported, it is lora.merge's model; over another base, refused."""
    from star_haiku_xmap import plugin
    from star_haiku_xmap.model import lora

    src = tmp_path / "base"
    tok = HFTokenizer(tok_file).to_dict()
    hf_import.convert_hf(FIXTURES / "llama_tiny", src, dtype="float32", tokenizer=tok)
    b = plugin.HaikuXmapBackend.from_table(checkpoint_path=str(src), train_checkpoint_minutes=0, mesh={"dp": 1, "mp": 1})
    examples = [TrainExample(f"Q: {i} + {i}\nA:", f" {2 * i}") for i in range(8)]
    spec = TrainSpec(steps=3, batch_size=4, grad_accum=1, seed=1, optimizer={"lr": 1e-2, "warmup_steps": 0},
                     adapter={"kind": "lora", "rank": 4, "targets": ["q_proj", "down_proj"]})
    res = b.train(str(src), tmp_path / "run" / "model", examples, spec)
    assert main(["convert", "--to", "hf", res.checkpoint, str(tmp_path / "hf")]) == 0
    hf_import.convert_hf(tmp_path / "hf", tmp_path / "back", dtype="float32", tokenizer=tok)
    got, _ = C.load_checkpoint(tmp_path / "back")
    base, _ = C.load_checkpoint(src)
    adapters, m = C.load_checkpoint(res.checkpoint)
    want = lora.merge(base, adapters, lora.LoraSpec.from_dict(m["extra"]["lora"]))
    for mod, leaves in want.items():
        for name, w in leaves.items():
            np.testing.assert_allclose(np.asarray(got[mod][name]), np.asarray(w), atol=1e-6, rtol=0)
    assert not np.allclose(np.asarray(got["h_0/attn/q"]["w"]), np.asarray(base["h_0/attn/q"]["w"]))
    shutil.rmtree(src)  # another model where the base was: the adapters are not merged into it
    hf_import.convert_hf(FIXTURES / "qwen2_tiny", src, dtype="float32", tokenizer=tok)
    assert main(["convert", "--to", "hf", res.checkpoint, str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert "merged only into their own base" in err and not (tmp_path / "hf2").exists()


def test_a_failed_export_leaves_nothing(root, imported, tmp_path, monkeypatch):
    calls = []
    real = hf_export.read_leaf

    def failing(src, leaf):
        calls.append(leaf["path"])
        if len(calls) == 5:
            raise OSError(28, "No space left on device")  # mid-way through the safetensors file
        return real(src, leaf)

    monkeypatch.setattr(hf_export, "read_leaf", failing)
    dest = tmp_path / "new" / "deeper" / "hf"
    with pytest.raises(OSError, match="No space left"):
        hf_export.export_hf(imported["mistral"], dest)
    assert len(calls) == 5 and list(tmp_path.iterdir()) == []  # no folder, no temporary, no parents
    monkeypatch.setattr(hf_export, "read_leaf", real)
    hf_export.export_hf(imported["mistral"], dest)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["hf"]


@pytest.mark.parametrize("args,message", [
    (["--mp", "2"], "--mp does not apply"),
    (["--from", "hf"], "convert to a native checkpoint first"),
    (["--max-shard-size", "lots"], "not a size"),
    (["--max-shard-size", "0"], "at least 1 byte"),
])
def test_bad_options(root, imported, tmp_path, capsys, args, message):
    assert main(["convert", "--to", "hf", str(imported["llama"]), str(tmp_path / "o"), *args]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_option_scope(root, imported, tmp_path, capsys):
    assert main(["convert", str(imported["llama"]), str(tmp_path / "o")]) == 2
    assert "--from: required" in capsys.readouterr().err
    assert main(["convert", "--from", "native", str(imported["llama"]), str(tmp_path / "o"),
                 "--max-shard-size", "1GB"]) == 2
    assert "only with --to hf" in capsys.readouterr().err and not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- with transformers


def _engine(checkpoint: Path):
    from star_haiku_xmap.plugin import HaikuXmapBackend

    return HaikuXmapBackend.from_table(checkpoint_path=str(checkpoint), mesh={"dp": 1, "mp": 1}, dtype="float32")


# qwen2, mistral and the byte tokenizer in CI's slow step (the default run's time, ~15 minutes)
@pytest.mark.parametrize("family", [*(f if f in ("gptj", "llama") else pytest.param(f, marks=pytest.mark.slow)
                                      for f in FAMILIES), "finetuned", pytest.param("gptj_byte", marks=pytest.mark.slow)])
def test_transformers_computes_the_engines_logits_and_greedy_text(family, root, imported, finetuned, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    if family == "gptj_byte":  # the byte tokenizer and a vocabulary padded past it (264 > 257)
        cfg = PRESETS["tiny"].replace(n_layer=1, n_ctx=64)
        src = tmp_path / "ck"
        CW.save_checkpoint(src, model.init_params(cfg, 3), model_config=cfg.to_dict(),
                           tokenizer=ByteTokenizer().to_dict())
    else:
        src = finetuned if family == "finetuned" else imported[family]
    dest = tmp_path / "hf"
    export(src, dest)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(dest)
    config, params, _ = inference.load_model(src)
    assert config.dtype == "float32"

    seqs = [np.random.default_rng(i).integers(0, config.vocab, n) for i, n in enumerate((1, 9, 64))]
    worst = 0.0
    for seq in seqs:
        ours = np.asarray(model.forward(params, seq[None], config))[0]
        with torch.no_grad():
            theirs = hf_model(torch.tensor(seq[None])).logits[0].numpy()
        worst = max(worst, float(np.abs(ours - theirs).max()))
    print(f"{family}: max |logits difference| {worst:.3g}")
    assert worst <= TOL

    n_new = 16
    spec = GenSpec(max_new_tokens=n_new, temperature=0.0, top_p=1.0, stop=(), batch_size=2)
    engine = _engine(src)
    texts = engine.generate(str(src), [GenRequest(p, seed=0) for p in PROMPTS], spec)
    tok = engine.tokenizer
    assert sum(map(len, texts)) > 40  # real continuations, not end-of-text at once
    for prompt, text in zip(PROMPTS, texts):
        ids = hf_tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert ids[0].tolist() == tok.encode(prompt)
        with torch.no_grad():
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n_new)
        new = out[0, ids.shape[1]:].tolist()
        assert hf_tok.decode(new, skip_special_tokens=True) == text, f"{family}: {prompt!r}"
        # Not decided by a near-tie: every greedy step's top-1 leads its top-2 by far more than TOL.
        full = np.array(tok.encode(prompt) + new[:-1])
        logits = np.asarray(model.forward(params, full[None], config))[0, ids.shape[1] - 1:, :tok.vocab_size]
        top2 = np.sort(logits, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0]).min() > 10 * TOL, f"{family}: {prompt!r} has a near-tie"
