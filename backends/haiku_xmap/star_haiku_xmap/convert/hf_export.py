"""Export a native checkpoint as a Hugging Face folder (``star-engine convert --to hf``):
GPT-J as ``GPTJForCausalLM``, the Llama family as ``LlamaForCausalLM``, ``Qwen2ForCausalLM``
or ``MistralForCausalLM``, loadable by ``transformers.AutoModelForCausalLM.from_pretrained``
and the tools that read that layout (vLLM, lm-evaluation-harness).

The tensor names are the importer's, inverted (``hf_import.hf_name`` for GPT-J,
``hf_llama.hf_name`` for the Llama family): matrices transposed back from haiku's
(in, out) to PyTorch's (out, in), nothing else. The engine computes rotary
embeddings in HF's own layouts (GPT-J's interleaved pairs over ``rotary_dim``, the
Llama family's "rotate half"), so no q/k permutation is applied either way, and a
re-import gives back every parameter bit for bit. A tied model has no ``lm_head``
parameter and writes no ``lm_head.weight``.

The Llama family's ``model_type`` follows from what the config needs: q/k/v biases
exist in Qwen2 only (``qwen2``, also with a sliding window on every layer), a
sliding window without them is Mistral's (``mistral``), anything else is ``llama``
(a Mistral model without a window, v0.2/v0.3, computes the same function as a
``LlamaForCausalLM``). ``config.json`` spells out every field (the classes'
defaults differ), rope as ``rope_theta`` + ``rope_scaling``.

Written: ``model.safetensors`` (or ``model-0000K-of-0000N.safetensors`` shards of at
most ``max_shard_size`` bytes and ``model.safetensors.index.json``; metadata
``{"format": "pt"}``), ``config.json``, ``generation_config.json``, ``tokenizer.json``
and ``tokenizer_config.json``. The safetensors header is computed from the manifest
first, then one tensor at a time is read (sha256-verified), transposed, cast and
appended. Everything goes into a temporary sibling folder, fsynced, then renamed
into place; an existing destination is refused before anything is written.

The byte tokenizer (``tokenizer.ByteTokenizer``) is written as an equivalent
``tokenizer.json``: a byte-level BPE without merges whose token ``b`` is byte ``b``
(GPT-2's byte-to-character table), plus ``<|endoftext|>`` = 256; it encodes and
decodes text exactly as the engine does.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from collections.abc import Callable, Mapping

import numpy as np

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from star_engine import IntegrityError, UserError
from star_engine.helpers import fsync_dir, temporary_sibling

from ..model.config import GPTJConfig, ModelConfig, architecture, config_from_dict
from . import hf_llama
from ..model.lora import LoraSpec
from ..tokenizer import TOKENIZER_FILE_MAX
from ..checkpoint.format import MANIFEST, checked_manifest, manifest_sha256, param_specs, read_leaf, read_manifest
from .hf_import import hf_name as gptj_hf_name
from ..checkpoint.safeio import make_parents, np_dtype, read_bounded, remove_created

DEFAULT_MAX_SHARD = 5 * 10**9  # transformers' save_pretrained default, "5GB"
_BLOCK = 1 << 20  # bytes (as fp32) of one block of rows converted at a time
_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16"}
_CLASSES = {"gptj": "GPTJForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}
_BOS_NAMES = ("<|begin_of_text|>", "<s>")  # Llama 3, Llama 2 / Mistral
EOT = "<|endoftext|>"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes for ``"5GB"``, ``"500MiB"``, ``"1000"`` (transformers' ``max_shard_size`` spelling)."""
    m = _SIZE.match(str(text))
    if not m:
        raise UserError(f"--max-shard-size: {text!r} is not a size (e.g. 5GB, 500MiB, 1000000)")
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()])
    if size < 1:
        raise UserError(f"--max-shard-size: must be at least 1 byte, got {text!r}")
    return size


# ----------------------------------------------------------------------------- config.json


def _gptj_config_json(config: GPTJConfig, head: dict[str, Any], tail: dict[str, Any], where: str) -> dict[str, Any]:
    if config.n_head * config.d_head != config.d_model:
        raise UserError(f"{where}: GPT-J with n_head x d_head = {config.n_head * config.d_head} != d_model "
                        f"{config.d_model} has no Hugging Face equivalent (HF derives the head size)")
    return {**head, "n_positions": config.n_ctx, "n_embd": config.d_model, "n_layer": config.n_layer,
            "n_head": config.n_head, "rotary_dim": config.rotary_dim, "n_inner": config.d_ff,
            "activation_function": "gelu_new", "layer_norm_epsilon": config.ln_eps, "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": False, **tail}


@dataclass(frozen=True)
class _Family:
    """What the export knows of an architecture (by its registry name): the HF
    ``model_type`` of a config, its ``config.json`` (head and tail fields given), the
    HF name of each native tensor, and whether its beginning-of-text token is the
    end-of-text one (GPT-2's convention, HF's GPT-J config)."""

    model_type: Callable[[Any], str]
    config_json: Callable[[Any, dict[str, Any], dict[str, Any], str], dict[str, Any]]
    hf_name: Callable[[tuple[str, ...]], tuple[str, bool]]
    bos_is_eos: bool


_FAMILIES = {"gptj": _Family(lambda config: "gptj", _gptj_config_json, gptj_hf_name, True),
             "llama": _Family(hf_llama.model_type, hf_llama.config_json, hf_llama.hf_name, False)}
KNOWN = tuple(_FAMILIES)


def hf_model_type(config: ModelConfig) -> str:
    return _FAMILIES[architecture(config)].model_type(config)


def hf_config(config: ModelConfig, dtype: str, ids: Mapping[str, int | None], where: str) -> dict[str, Any]:
    """``config.json`` for ``config`` stored as ``dtype``, every field explicit."""
    kind = hf_model_type(config)
    head = {"architectures": [_CLASSES[kind]], "model_type": kind, "vocab_size": config.vocab}
    tail = {"initializer_range": 0.02, "use_cache": True, "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"], "torch_dtype": dtype, "dtype": dtype}
    return _FAMILIES[architecture(config)].config_json(config, head, tail, where)


# ----------------------------------------------------------------------------- tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: each byte as a printable character (byte-level BPE's alphabet)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer_json() -> str:
    """``tokenizer.json`` equivalent to ``ByteTokenizer``: byte ``b`` is token ``b``, ``<|endoftext|>`` 256."""
    table = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    return tok.to_str()


def tokenizer_files(tok: Mapping[str, Any], config: ModelConfig, where: str) -> tuple[str, dict, dict[str, int | None]]:
    """(tokenizer.json text, tokenizer_config.json, {bos, eos, pad ids, vocab size}) for a stored
    tokenizer description. The beginning-of-text token is the end-of-text one for GPT-J and the
    byte tokenizer (GPT-2's convention, HF's GPT-J config), else Llama's when the vocabulary has it."""
    text: str | None
    if tok.get("kind") == "byte":
        text, eos_token = byte_tokenizer_json(), EOT
    elif tok.get("kind") == "hf":
        text = tok.get("json")
        if text is None:  # a large tokenizer.json is stored by path and sha256 only
            path = Path(str(tok.get("path")))
            try:
                text = read_bounded(path, TOKENIZER_FILE_MAX).decode("utf-8")
            except (IntegrityError, UnicodeDecodeError):
                raise UserError(f"{where}: the checkpoint's tokenizer.json is not stored in it and {path} is missing "
                                "or unreadable; pass --tokenizer-file") from None
        if not isinstance(text, str) or hashlib.sha256(text.encode("utf-8")).hexdigest() != tok.get("sha256"):
            raise IntegrityError(f"{where}: tokenizer.json differs from the one the checkpoint recorded "
                                 "(sha256); pass --tokenizer-file")
        eos_token = str(tok.get("eos_token", EOT))
    else:
        raise IntegrityError(f"{where}: unknown tokenizer kind {tok.get('kind')!r}")
    hf = Tokenizer.from_str(text)
    eos = hf.token_to_id(eos_token)
    if eos is None:
        raise IntegrityError(f"{where}: the tokenizer has no end-of-text token {eos_token!r}")
    bos_token = eos_token if tok.get("kind") == "byte" or _FAMILIES[architecture(config)].bos_is_eos else next(
        (t for t in _BOS_NAMES if hf.token_to_id(t) is not None), None)
    ids = {"bos": None if bos_token is None else hf.token_to_id(bos_token), "eos": eos, "pad": eos,
           "vocab": hf.get_vocab_size(with_added_tokens=True)}
    # (the parameter's name, reused for tokenizer_config.json)
    config = cast(Any, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos_token,
                        "eos_token": eos_token, "pad_token": eos_token, "unk_token": None,
                        "model_max_length": config.n_ctx, "clean_up_tokenization_spaces": False})
    return text, cast(dict, config), ids


# ----------------------------------------------------------------------------- tensors


@dataclass(frozen=True)
class _Tensor:
    name: str
    leaf: Mapping[str, Any]  # the manifest entry
    transpose: bool
    shape: tuple[int, ...]
    nbytes: int


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def plan_tensors(manifest: Mapping[str, Any], config: ModelConfig, dtype: str) -> list[_Tensor]:
    hf_name = _FAMILIES[architecture(config)].hf_name
    size = np_dtype(dtype).itemsize
    out = []
    for leaf in manifest["leaves"]:
        name, transpose = hf_name(tuple(leaf["path"]))
        shape = tuple(reversed(leaf["shape"])) if transpose else tuple(leaf["shape"])
        out.append(_Tensor(name, leaf, transpose, shape, int(np.prod(shape, dtype=np.int64)) * size))
    return sorted(out, key=lambda t: _natural(t.name))


def shard(tensors: list[_Tensor], max_bytes: int) -> list[list[_Tensor]]:
    """Consecutive groups of at most ``max_bytes`` of tensor data (a larger tensor alone)."""
    groups: list[list[_Tensor]] = [[]]
    used = 0
    for t in tensors:
        if groups[-1] and used + t.nbytes > max_bytes:
            groups.append([])
            used = 0
        groups[-1].append(t)
        used += t.nbytes
    return groups


def _header(tensors: list[_Tensor], dtype: str) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": _ST_DTYPE[dtype], "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


def _write_tensor(f, value: np.ndarray, target: np.dtype) -> None:
    """Append ``value``'s bytes as ``target``: directly when it is stored so, else converted
    (transposed, cast) a block of rows at a time, so that no second copy of it is made."""
    if value.dtype == target and value.flags.c_contiguous:
        f.write(memoryview(cast(Any, value.reshape(-1).view(np.uint8))))  # numpy stubs: __buffer__ 3.12+ only
        return
    rows = max(1, _BLOCK // max(1, value[:1].size * 4))
    for i in range(0, value.shape[0], rows):
        block = np.ascontiguousarray(value[i:i + rows])
        if block.dtype != target:  # fp32 -> bf16 rounds to nearest even, as the engine's casts do
            block = block.astype(np.float32, copy=False).astype(target)
        f.write(memoryview(cast(Any, block.reshape(-1).view(np.uint8))))
        del block


def _write_safetensors(path: Path, src: Path, tensors: list[_Tensor], dtype: str, lora: Any = None) -> None:
    """``lora``: (adapter folder, {module: (A leaf, B leaf)}, scale): W + scale A B, one at a time."""
    target = np_dtype(dtype).newbyteorder("<")
    with open(path, "wb") as f:
        f.write(_header(tensors, dtype))
        for t in tensors:
            value = read_leaf(src, t.leaf)  # verified against its sha256
            if lora is not None and t.leaf["path"][1] == "w" and t.leaf["path"][0] in lora[1]:
                a, b = (read_leaf(lora[0], leaf) for leaf in lora[1][t.leaf["path"][0]])
                value = value.astype(np.float32) + np.float32(lora[2]) * (a @ b)
            if t.transpose:
                value = value.T
            if value.shape != t.shape:  # checked_manifest checked the shapes: a bug if reached
                raise RuntimeError(f"{t.name}: shape {value.shape}, the header says {t.shape}")
            _write_tensor(f, value, target)
            del value
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------- export


def _json_file(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def rename_noreplace(tmp: Path, dest: Path) -> None:
    """``rename(tmp, dest)`` that fails when ``dest`` appeared meanwhile (Linux ``RENAME_NOREPLACE``)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(tmp), at_fdcwd, os.fsencode(dest), noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise UserError(f"{dest}: appeared while exporting; refusing to overwrite it")
        if err not in (errno.EINVAL, errno.ENOSYS):  # else: no renameat2 on this filesystem
            raise OSError(err, os.strerror(err), str(dest))
    if dest.exists() or dest.is_symlink():
        raise UserError(f"{dest}: appeared while exporting; refusing to overwrite it")
    os.rename(tmp, dest)


def _source(src: Path) -> tuple[dict, ModelConfig, Any]:
    """The checkpoint's manifest (checked), model config and LoRA merge (``_write_safetensors``;
    None for a whole model); unknown architectures refused by name. A LoRA checkpoint's
    tensors are its base's (checked to be the base it was trained over) with the adapters merged."""
    where = src / MANIFEST
    if not where.is_file():
        raise UserError(f"{src}: not a checkpoint of this backend (no {MANIFEST})")
    m = read_manifest(src)
    arch = m["model_config"].get("architecture", "gptj")
    if arch not in KNOWN:
        raise UserError(f"{where}: architecture {arch!r} has no Hugging Face export (known: {', '.join(KNOWN)})")
    lora = None
    if m["extra"].get("kind") == "lora":
        m, extra = checked_manifest(src), m["extra"]
        base = (src / extra["base_path"]).resolve()
        if not (base / MANIFEST).is_file() or manifest_sha256(base) != extra["base"]:
            raise UserError(f"{where}: its adapters were trained over base {extra['base'][:16]}..., which is not "
                            f"at {base}; adapters are merged only into their own base")
        pairs: dict = {}
        for leaf in m["leaves"]:
            pairs.setdefault(leaf["path"][0], {})[leaf["path"][1]] = leaf
        spec = LoraSpec.from_dict(extra["lora"])
        lora, src = (src, {k: (v["lora_a"], v["lora_b"]) for k, v in pairs.items()}, spec.scale), base
    m = checked_manifest(src)
    if {tuple(leaf["path"]) for leaf in m["leaves"]} != set(param_specs(m["model_config"])):
        raise UserError(f"{where}: does not hold exactly the model's parameters; --to hf writes whole models")
    return m, config_from_dict(m["model_config"]), (src, lora)


def export_hf(checkpoint: str | os.PathLike, dest: str | os.PathLike, *, dtype: str | None = None,
              max_shard_size: int = DEFAULT_MAX_SHARD, tokenizer: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write native checkpoint ``checkpoint`` as a Hugging Face folder at ``dest`` (new).
    ``dtype``: the stored dtype (default: the checkpoint's); ``tokenizer``: a tokenizer
    description (default: the checkpoint's). Returns a summary (model_type, files, tensors, bytes)."""
    src, dest = Path(checkpoint), Path(dest)
    if dest.exists() or dest.is_symlink():
        raise UserError(f"{dest}: exists; refusing to overwrite it (nothing written)")
    m, config, (src, lora) = _source(src)
    dtype = dtype or config.dtype
    if dtype not in _ST_DTYPE:
        raise UserError(f"--dtype: {dtype!r} cannot be exported (one of {', '.join(_ST_DTYPE)})")
    where = str(src / MANIFEST)
    tokenizer = tokenizer or m["tokenizer"]
    if tokenizer.get("vocab_size", 0) > config.vocab:
        raise UserError(f"the tokenizer has {tokenizer['vocab_size']} tokens, more than the model's vocab "
                        f"{config.vocab}")
    text, tok_config, ids = tokenizer_files(tokenizer, config, where)
    model_config = hf_config(config, dtype, ids, where)
    generation: dict[str, Any] = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"]}
    assert ids["vocab"] is not None  # tokenizer_files always counts the vocabulary
    if ids["vocab"] < config.vocab:  # the rows past the tokenizer's, never generated by the engine (valid_vocab)
        generation["suppress_tokens"] = list(range(ids["vocab"], config.vocab))
    tensors = plan_tensors(m, config, dtype)
    groups = shard(tensors, max_shard_size)
    n = len(groups)
    files = ["model.safetensors"] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]

    created = make_parents(dest)  # taken away again if the export fails
    tmp = temporary_sibling(dest)
    tmp.mkdir()
    try:
        for fname, group in zip(files, groups):
            _write_safetensors(tmp / fname, src, group, dtype, lora)
        total = sum(t.nbytes for t in tensors)
        if n > 1:
            _json_file(tmp / "model.safetensors.index.json",
                       {"metadata": {"total_size": total},
                        "weight_map": {t.name: f for f, g in zip(files, groups) for t in g}})
        _json_file(tmp / "config.json", model_config)
        _json_file(tmp / "generation_config.json", generation)
        _json_file(tmp / "tokenizer_config.json", tok_config)
        with open(tmp / "tokenizer.json", "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        rename_noreplace(tmp, dest)
        fsync_dir(dest.parent)  # the rename itself survives a power cut
        created = []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_created(created)
    return {"model_type": model_config["model_type"], "architecture": model_config["architectures"][0],
            "files": files, "tensors": len(tensors), "bytes": total, "dtype": dtype}
