"""Tokenizers: one small interface, two implementations.

Every tokenizer has ``encode(str) -> list[int]``, ``decode(list[int]) -> str``,
``eos_id``, ``pad_id``, ``vocab_size`` and ``to_dict()``, a JSON/msgpack-able
self-description stored in checkpoints; ``tokenizer_from_dict(d)`` rebuilds it.

- ``ByteTokenizer``: UTF-8 bytes are ids 0..255, end-of-text is 256. For tiny
  models trained from scratch.
- ``HFTokenizer(path)``: a Hugging Face ``tokenizer.json`` (GPT-2 BPE as GPT-J
  uses it, end-of-text ``<|endoftext|>``). Its description records the file's
  sha256 and, when the file is small, the JSON itself, so a checkpoint stays
  loadable after the file moves.

Text never turns into control tokens: ``encode`` treats special-token strings
in its input (``"<|endoftext|>"``) as ordinary text, so data cannot inject an
end-of-text. ``decode`` drops end-of-text, padding and ids the tokenizer does
not know (e.g. GPT-J's 143 padding rows of the vocabulary).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from collections.abc import Mapping, Sequence

from star_engine import IntegrityError, UserError

from .checkpoint.safeio import read_bounded

INLINE_JSON_MAX = 4 << 20  # tokenizer.json files up to this size are stored in the description
TOKENIZER_FILE_MAX = 64 << 20
EOT_TOKEN = "<|endoftext|>"


@runtime_checkable
class Tokenizer(Protocol):
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


class ByteTokenizer:
    """UTF-8 bytes (ids 0..255) plus end-of-text (256), which also pads."""

    eos_id = 256
    pad_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes back to text; partial or invalid UTF-8 becomes U+FFFD, ids
        outside 0..255 (end-of-text, padding rows) are dropped."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "byte", "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash("ByteTokenizer")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer.json (a file, or a folder holding one)."""

    def __init__(self, path: str | Path, *, eos_token: str = EOT_TOKEN, _json: str | None = None) -> None:
        from tokenizers import Tokenizer as _HF  # 0.06 s, only for a tokenizer.json model

        p = Path(path)
        if _json is None:
            if p.is_dir():
                p = p / "tokenizer.json"
            if p.suffix in (".bin", ".pt", ".pkl", ".pickle"):
                raise UserError(f"{p}: pickled tokenizers are not loaded; use a tokenizer.json")
            raw = read_bounded(p, TOKENIZER_FILE_MAX)
            try:
                _json = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{p}: tokenizer file is not UTF-8 JSON") from None
        self.path = str(p.resolve()) if _json is None else str(p)
        self._json = _json
        self.sha256 = hashlib.sha256(_json.encode("utf-8")).hexdigest()
        try:
            self._tok = _HF.from_str(_json)
        except Exception as exc:  # tokenizers raises a bare Exception for bad JSON
            raise UserError(f"{p}: not a valid tokenizer.json ({_short(exc)})") from None
        except BaseException as exc:  # a panic in the Rust library (pyo3's PanicException)
            if type(exc).__name__ != "PanicException":
                raise
            raise UserError(f"{p}: not a valid tokenizer.json (the tokenizers library failed: {_short(exc)})") from None
        if not isinstance(eos_token, str):
            raise UserError(f"{p}: end-of-text token must be a string, got {eos_token!r}")
        eos = self._tok.token_to_id(eos_token)
        if eos is None:
            raise UserError(f"{p}: the tokenizer has no end-of-text token {eos_token!r}")
        self.eos_token = eos_token
        self.eos_id = eos
        self.pad_id = eos
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._tok.encode_special_tokens = True  # "<|endoftext|>" in text stays text
        self._special = {eos} | {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        keep = [int(i) for i in ids if 0 <= int(i) < self.vocab_size and int(i) not in self._special]
        return self._tok.decode(keep, skip_special_tokens=False)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": "hf", "sha256": self.sha256, "path": self.path,
                             "eos_token": self.eos_token, "vocab_size": self.vocab_size, "eos_id": self.eos_id}
        if len(self._json.encode("utf-8")) <= INLINE_JSON_MAX:
            d["json"] = self._json
        return d

    def __repr__(self) -> str:
        return f"HFTokenizer({self.path!r}, sha256={self.sha256[:12]})"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:300] + "..."


def _field(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in d or not isinstance(d[key], kind) or isinstance(d[key], bool):
        raise IntegrityError(f"tokenizer description: field {key!r} missing or not {kind}")
    return d[key]


def tokenizer_from_dict(d: Mapping[str, Any]) -> ByteTokenizer | HFTokenizer:
    """Rebuild a tokenizer from ``to_dict()``. An HF tokenizer is built from the
    stored JSON when present, else from ``path``; either way its sha256 must
    match the recorded one (``IntegrityError`` otherwise)."""
    if not isinstance(d, Mapping):
        raise IntegrityError("tokenizer description: not a mapping")
    kind = d.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind != "hf":
        raise IntegrityError(f"tokenizer description: unknown kind {kind!r}")
    sha = _field(d, "sha256", str)
    path = _field(d, "path", str)
    eos_token = d.get("eos_token", EOT_TOKEN)
    text = d.get("json")
    if text is not None:
        if not isinstance(text, str):
            raise IntegrityError("tokenizer description: field 'json' is not a string")
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != sha:
            raise IntegrityError("tokenizer description: stored tokenizer JSON does not match its sha256")
        tok = HFTokenizer(path, eos_token=eos_token, _json=text)
    else:
        tok = HFTokenizer(path, eos_token=eos_token)
        if tok.sha256 != sha:
            raise IntegrityError(f"{tok.path}: sha256 {tok.sha256} differs from the checkpoint's {sha}")
    return tok
