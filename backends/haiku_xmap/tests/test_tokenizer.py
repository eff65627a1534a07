"""Tokenizers: byte-level round trips, HF tokenizer.json self-description."""

from __future__ import annotations

import hashlib
import json

import pytest

from star_engine.errors import IntegrityError, UserError
from star_haiku_xmap.tokenizer import (ByteTokenizer, HFTokenizer, INLINE_JSON_MAX, Tokenizer,
                                       tokenizer_from_dict)


def make_bpe_json(tmp_path, *, with_eot: bool = True):
    """A tiny byte-level BPE tokenizer.json like GPT-2's, trained here (no download)."""
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>"] if with_eot else []
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Q: what is two plus two? A: four.", "The answer is (e) blotter.", "héllo wörld ünïcode"] * 20
    tok.train_from_iterator(corpus, trainer)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_byte_roundtrip_and_ids():
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    text = "Q: 1 2 + 3 4\nA: ünïcode ✓ 😀"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 256, 257)


def test_byte_decode_tolerates_partial_utf8_and_drops_control_ids():
    tok = ByteTokenizer()
    emoji = "😀".encode()  # 4 bytes
    assert tok.decode(list(emoji[:2])) == "\ufffd"
    assert tok.decode(list(b"ok") + list(emoji[:3])) == "ok\ufffd"
    assert tok.decode([104, 256, 105, 300, -1]) == "hi"  # end-of-text, padding rows, junk dropped
    assert tok.encode("<|endoftext|>") == list(b"<|endoftext|>")  # text never becomes end-of-text


def test_byte_to_dict_roundtrip():
    d = ByteTokenizer().to_dict()
    assert json.loads(json.dumps(d)) == d
    assert tokenizer_from_dict(d) == ByteTokenizer()


def test_hf_tokenizer_roundtrip(tmp_path):
    path = make_bpe_json(tmp_path)
    tok = HFTokenizer(path)
    text = "Q: what is two plus two? A: four. héllo"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode("utf-8"))  # merges were applied
    assert tok.decode(ids) == text
    assert tok.eos_id == tok.pad_id == tok._tok.token_to_id("<|endoftext|>")
    assert tok.vocab_size == tok._tok.get_vocab_size(with_added_tokens=True)
    assert tok.decode(ids + [tok.eos_id, tok.vocab_size + 5]) == text
    assert HFTokenizer(tmp_path).encode(text) == ids  # a folder holding tokenizer.json works too


def test_hf_special_token_text_is_not_a_control_token(tmp_path):
    tok = HFTokenizer(make_bpe_json(tmp_path))
    ids = tok.encode("a<|endoftext|>b")
    assert tok.eos_id not in ids
    assert tok.decode(ids) == "a<|endoftext|>b"


def test_hf_to_dict_inlines_json_and_checks_sha(tmp_path):
    path = make_bpe_json(tmp_path)
    tok = HFTokenizer(path)
    d = tok.to_dict()
    assert d["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "json" in d
    path.unlink()  # the stored JSON suffices once the file is gone
    again = tokenizer_from_dict(d)
    assert again.encode("two plus two") == tok.encode("two plus two")
    bad = dict(d, json=d["json"] + " ")  # tampered inline copy
    with pytest.raises(IntegrityError, match="sha256"):
        tokenizer_from_dict(bad)


def test_hf_from_dict_by_path_detects_changed_file(tmp_path, monkeypatch):
    import star_haiku_xmap.tokenizer as T

    path = make_bpe_json(tmp_path)
    monkeypatch.setattr(T, "INLINE_JSON_MAX", 10)  # force the by-path form
    d = HFTokenizer(path).to_dict()
    assert "json" not in d and d["path"] == str(path.resolve())
    assert tokenizer_from_dict(d).encode("four") == HFTokenizer(path).encode("four")
    path.write_text(path.read_text() + "\n")  # still valid, no longer the recorded file
    with pytest.raises(IntegrityError, match="differs from the checkpoint"):
        tokenizer_from_dict(d)
    assert INLINE_JSON_MAX > 2_000_000  # GPT-2's 1.36 MB tokenizer.json is stored inline


def test_hf_refusals(tmp_path):
    with pytest.raises(UserError, match="end-of-text"):
        HFTokenizer(make_bpe_json(tmp_path, with_eot=False))
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not a valid tokenizer.json"):
        HFTokenizer(bad)
    pkl = tmp_path / "tokenizer.pkl"
    pkl.write_bytes(b"\x80\x04N.")
    with pytest.raises(UserError, match="pickled"):
        HFTokenizer(pkl)
    with pytest.raises(IntegrityError, match="unknown kind"):
        tokenizer_from_dict({"kind": "sentencepiece"})
    with pytest.raises(IntegrityError, match="missing"):
        HFTokenizer(tmp_path / "nope.json")
