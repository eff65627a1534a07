"""Import a Hugging Face checkpoint (safetensors only) into haiku params: GPT-J,
or the Llama family (``model_type`` llama, qwen2, mistral: ``hf_llama.py`` maps
their config and names), picked by ``config.json``'s ``model_type``.

A source folder holds ``config.json`` and either ``model.safetensors`` or shards
listed in ``model.safetensors.index.json``. Pickle-based weights (``.bin``,
``.pt``) are refused without being opened: convert them to safetensors first.
Every safetensors header is validated here (``safeio.read_safetensors_header``)
before ``safe_open`` touches the file; tensors are then read one at a time,
transposed from PyTorch's (out, in) to haiku's (in, out) (all but the
embedding) and cast to the requested dtype.

Name mapping for GPT-J (HF -> haiku)::

    transformer.wte.weight                  wte/embeddings
    transformer.h.{i}.ln_1.{weight,bias}    h_{i}/ln/{scale,offset}
    transformer.h.{i}.attn.{q,k,v}_proj.weight   h_{i}/attn/{q,k,v}/w   (transposed)
    transformer.h.{i}.attn.out_proj.weight  h_{i}/attn/out/w            (transposed)
    transformer.h.{i}.mlp.fc_{in,out}.weight     h_{i}/mlp/fc_{in,out}/w (transposed)
    transformer.h.{i}.mlp.fc_{in,out}.bias       h_{i}/mlp/fc_{in,out}/b
    transformer.ln_f.{weight,bias}          ln_f/{scale,offset}
    lm_head.weight / lm_head.bias           lm_head/w (transposed) / lm_head/b

The attention-mask buffers some exports carry (``attn.bias``, ``attn.masked_bias``)
are ignored; any other unknown or missing tensor is an error.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import numpy as np

from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from star_engine import IntegrityError, UserError

from ..model.config import GPTJConfig, ModelConfig, architecture
from . import hf_llama
from ..checkpoint.format import param_specs
from ..checkpoint.write import write_checkpoint
from ..checkpoint.safeio import TensorInfo, check_alloc, np_dtype, read_bounded, read_json, read_safetensors_header
from ..tokenizer import EOT_TOKEN, TOKENIZER_FILE_MAX, HFTokenizer

CONFIG_MAX = 1 << 20
INDEX_MAX = 16 << 20
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_IGNORED = re.compile(r"^transformer\.h\.\d+\.attn\.(bias|masked_bias)$")
_SHARD_NAME = re.compile(r"^[A-Za-z0-9._-]+\.safetensors$")


def _refuse_pickle(p: Path) -> None:
    raise UserError(f"{p}: pickle-based weights are never loaded (unpickling runs arbitrary code); "
                    "convert the checkpoint to safetensors (model.safetensors) first")


def hf_config_to_gptj(hf: dict, *, dtype: str = "float32", where: str = "config.json") -> GPTJConfig:
    """GPTJConfig for an HF GPT-J ``config.json`` dict; refuses what the model cannot express."""
    def need(key: str) -> Any:
        if key not in hf:
            raise UserError(f"{where}: missing key {key!r}")
        return hf[key]

    if hf.get("model_type") != "gptj":
        raise UserError(f"{where}: model_type is {hf.get('model_type')!r}, expected 'gptj'")
    act = hf.get("activation_function", "gelu_new")
    if act != "gelu_new":
        raise UserError(f"{where}: activation_function {act!r} is not supported (only 'gelu_new')")
    if hf.get("tie_word_embeddings", False):
        raise UserError(f"{where}: tied embeddings are not supported (GPT-J's head is untied)")
    d_model, n_head = need("n_embd"), need("n_head")
    if not isinstance(d_model, int) or not isinstance(n_head, int) or n_head <= 0 or d_model % n_head:
        raise UserError(f"{where}: n_embd {d_model!r} is not a multiple of n_head {n_head!r}")
    rotary = need("rotary_dim")
    if rotary is None:
        raise UserError(f"{where}: rotary_dim null (rotary over the whole embedding) is not supported")
    n_inner = hf.get("n_inner") or 4 * d_model
    try:
        return GPTJConfig(n_layer=need("n_layer"), d_model=d_model, n_head=n_head, d_head=d_model // n_head,
                          d_ff=n_inner, rotary_dim=rotary, n_ctx=need("n_positions"), vocab=need("vocab_size"),
                          ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)), dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None


def hf_name(key_path: tuple[str, ...]) -> tuple[str, bool]:
    """HF tensor name for a haiku key path, and whether it is transposed."""
    module, leaf = "/".join(key_path[:-1]), key_path[-1]
    if module == "wte":
        return "transformer.wte.weight", False
    if module in ("ln_f",):
        return f"transformer.ln_f.{'weight' if leaf == 'scale' else 'bias'}", False
    if module == "lm_head":
        return (("lm_head.weight", True) if leaf == "w" else ("lm_head.bias", False))
    m = re.fullmatch(r"h_(\d+)/(ln|attn/(q|k|v|out)|mlp/(fc_in|fc_out))", module)
    if not m:
        raise UserError(f"no HF name for parameter {'/'.join(key_path)}")
    base = f"transformer.h.{m.group(1)}"
    if m.group(2) == "ln":
        return f"{base}.ln_1.{'weight' if leaf == 'scale' else 'bias'}", False
    if m.group(3):
        return f"{base}.attn.{m.group(3)}_proj.weight", True
    return f"{base}.mlp.{m.group(4)}.{'weight' if leaf == 'w' else 'bias'}", leaf == "w"


def _tensor_files(src: Path) -> dict[str, tuple[Path, TensorInfo]]:
    """{tensor name: (file, validated header entry)} for the folder's safetensors."""
    single, index = src / "model.safetensors", src / "model.safetensors.index.json"
    if index.is_file():
        data = read_json(index, INDEX_MAX)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            raise IntegrityError(f"{index}: no 'weight_map' object")
        for name in weight_map.values():
            if not isinstance(name, str) or not _SHARD_NAME.match(name):
                raise IntegrityError(f"{index}: bad shard file name {name!r}")
        files = sorted(set(weight_map.values()))
    elif single.is_file():
        files, weight_map = ["model.safetensors"], None
    else:
        pickles = sorted(p.name for p in src.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            _refuse_pickle(src / pickles[0])
        raise UserError(f"{src}: no model.safetensors or model.safetensors.index.json")
    out: dict[str, tuple[Path, TensorInfo]] = {}
    for name in files:
        path = src / name
        if not path.is_file():
            raise IntegrityError(f"{path}: shard listed in the index is missing")
        tensors, _ = read_safetensors_header(path)
        for tname, info in tensors.items():
            if tname in out:
                raise IntegrityError(f"{path}: tensor {tname!r} also stored in {out[tname][0]}")
            if weight_map is not None and weight_map.get(tname) != name:
                raise IntegrityError(f"{path}: tensor {tname!r} is not mapped to this file by the index")
            out[tname] = (path, info)
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(out))
        if absent:
            raise IntegrityError(f"{index}: tensors listed but not stored: {absent[:5]}")
    return out


def _family(hf: dict, dtype: str, where: str):
    """(config, haiku path -> HF name mapping, tensors to ignore, family name) for ``config.json``."""
    if hf.get("model_type") in hf_llama.MODEL_TYPES:
        config = hf_llama.config_from_hf(hf, dtype=dtype, where=where)
        return config, hf_llama.hf_name, hf_llama.ignored(config), hf["model_type"]
    if hf.get("model_type") != "gptj":
        raise UserError(f"{where}: model_type is {hf.get('model_type')!r}, expected one of "
                        f"gptj, {', '.join(hf_llama.MODEL_TYPES)}")
    return hf_config_to_gptj(hf, dtype=dtype, where=where), hf_name, _IGNORED, "GPT-J"


def _plan(src: Path, dtype: str) -> tuple[ModelConfig, list[tuple[tuple[str, ...], str, bool, Path, TensorInfo]]]:
    """Validate everything (config, headers, names, shapes) before reading a tensor."""
    if src.is_file():
        if src.suffix in _PICKLE_SUFFIXES:
            _refuse_pickle(src)
        src = src.parent
    if not src.is_dir():
        raise UserError(f"{src}: no such folder")
    cfg_path = src / "config.json"
    hf = read_json(cfg_path, CONFIG_MAX, error=UserError)
    if not isinstance(hf, dict):
        raise UserError(f"{cfg_path}: not a JSON object")
    config, hf_name, ignore, family = _family(hf, dtype, str(cfg_path))
    tensors = _tensor_files(src)
    plan, used = [], set()
    for key_path, (shape, _) in sorted(param_specs(config.to_dict()).items()):
        name, transpose = hf_name(key_path)
        if name not in tensors:
            raise UserError(f"{src}: tensor {name!r} missing (needed for {'/'.join(key_path)})")
        path, info = tensors[name]
        stored = tuple(reversed(shape)) if transpose else shape
        if info.shape != stored:
            raise UserError(f"{path}: tensor {name!r} has shape {list(info.shape)}, config.json implies "
                            f"{list(stored)}")
        if info.dtype not in ("float32", "float16", "bfloat16"):
            raise UserError(f"{path}: tensor {name!r} has dtype {info.dtype}, expected a float type")
        plan.append((key_path, name, transpose, path, info))
        used.add(name)
    extra = sorted(n for n in tensors if n not in used and not ignore.match(n))
    if extra:
        raise UserError(f"{src}: unexpected tensors for {family}: {extra[:5]}")
    return config, plan


def iter_hf(src: str | os.PathLike, *, dtype: str = "float32"
            ) -> tuple[ModelConfig, Iterator[tuple[tuple[str, ...], np.ndarray]]]:
    """(config, lazy iterator of (haiku key path, array)) in sorted key order;
    everything is validated before the iterator is returned."""
    config, plan = _plan(Path(src), dtype)
    target = np_dtype(dtype)

    def leaves() -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
        handles: dict[Path, Any] = {}
        try:
            for key_path, name, transpose, path, info in plan:
                # the tensor as stored, its fp32 copy and the result: checked before any is made
                n = math.prod(info.shape)
                check_alloc(info.end - info.start + 4 * n + target.itemsize * n, f"{path}: tensor {name!r}")
                try:
                    if path not in handles:
                        handles[path] = safe_open(str(path), framework="numpy")
                    arr = handles[path].get_tensor(name)
                except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
                    raise IntegrityError(f"{path}: tensor {name!r} unreadable ({type(exc).__name__}: {exc})") from None
                if transpose:
                    arr = arr.T
                # fp16/bf16 -> fp32 is exact; fp32 -> bf16 rounds to nearest even.
                yield key_path, np.ascontiguousarray(arr.astype(np.float32).astype(target))
        finally:
            for h in handles.values():
                if hasattr(h, "__exit__"):
                    h.__exit__(None, None, None)

    return config, leaves()


def import_hf(src: str | os.PathLike, *, dtype: str = "float32") -> tuple[ModelConfig, dict]:
    """(config, haiku params as numpy arrays) for an HF safetensors folder (GPT-J or the Llama family)."""
    config, leaves = iter_hf(src, dtype=dtype)
    params: dict = {}
    for key_path, arr in leaves:
        params.setdefault("/".join(key_path[:-1]), {})[key_path[-1]] = arr
    return config, params


def folder_tokenizer(folder: str | os.PathLike, tokenizer_file: str | os.PathLike | None = None):
    """The HF tokenizer of a checkpoint folder (``tokenizer_file``, default the
    folder's ``tokenizer.json``), its end-of-text token named by ``config.json``'s
    ``eos_token_id`` when it has one (Llama 3: ``<|end_of_text|>``; Qwen2.5:
    ``<|endoftext|>``), else ``<|endoftext|>`` (GPT-J)."""
    folder = Path(folder)
    path = Path(tokenizer_file) if tokenizer_file else folder / "tokenizer.json"
    eos_token = EOT_TOKEN
    cfg = folder / "config.json"
    if cfg.is_file():
        try:
            eos_id = json.loads(read_bounded(cfg, CONFIG_MAX)).get("eos_token_id")
        except (ValueError, RecursionError, AttributeError):
            eos_id = None  # the importer reports a bad config.json by itself
        eos_id = eos_id[0] if isinstance(eos_id, list) and eos_id else eos_id
        if isinstance(eos_id, int) and not isinstance(eos_id, bool) and path.is_file():
            try:
                name = Tokenizer.from_str(read_bounded(path, TOKENIZER_FILE_MAX).decode("utf-8")).id_to_token(eos_id)
            except Exception:  # noqa: BLE001 - HFTokenizer below reports a bad file with its own message
                name = None
            eos_token = name if name is not None else eos_token
    return HFTokenizer(path, eos_token=eos_token)


def convert_hf(src: str | os.PathLike, dest: str | os.PathLike, *, dtype: str = "float32",
               tokenizer: dict | None = None, extra: dict | None = None) -> dict:
    """Convert an HF folder (GPT-J or the Llama family) into a native checkpoint at ``dest``, one tensor in
    memory at a time. ``tokenizer`` defaults to the folder's ``tokenizer.json``."""
    src = Path(src)
    if tokenizer is None:
        if not (src / "tokenizer.json").is_file():
            raise UserError(f"{src}: no tokenizer.json; pass tokenizer= (a tokenizer's to_dict())")
        tokenizer = folder_tokenizer(src).to_dict()
    config, leaves = iter_hf(src, dtype=dtype)
    info = {"source": source_name(config), **(extra or {})}
    return write_checkpoint(dest, leaves, model_config=config.to_dict(), tokenizer=tokenizer, extra=info)


def source_name(config: ModelConfig) -> str:
    """A converted checkpoint's ``extra.source``: hf_gptj or hf_llama."""
    return f"hf_{architecture(config)}"


# The names from before the Llama family, kept for callers.
iter_hf_gptj, import_hf_gptj, convert_hf_gptj = iter_hf, import_hf, convert_hf
