"""Export a LoRA checkpoint (``extra.kind = "lora"``, ``train/lora_stage.py``) as a Hugging Face
``peft`` adapter folder: what ``peft.PeftModel.from_pretrained(base, folder)`` and vLLM's
``--enable-lora`` (``POST /v1/load_lora_adapter``) load over the base model exported by
``convert --to hf`` (``hf_export.py``).

Written: ``adapter_config.json`` (``peft_type = "LORA"``, ``task_type = "CAUSAL_LM"``, ``r``,
``lora_alpha``, ``use_rslora``, ``target_modules`` as Hugging Face module names, no dropout, no
bias, ``base_model_name_or_path`` as given) and ``adapter_model.safetensors`` (metadata
``{"format": "pt"}``). The tensor of target ``m`` (HF module path, the merged export's tensor
name less ``.weight``: ``hf_import.hf_name`` / ``hf_llama.hf_name``) is
``base_model.model.<m>.lora_A.weight`` = A^T, (r, in), and ``...lora_B.weight`` = B^T, (out, r):
PyTorch's (out, in) convention, so that W_hf + scale * lora_B @ lora_A is the merged export's
weight, scale = alpha / r (``use_rslora``: alpha / sqrt r) as in ``model/lora.py``.

The base checkpoint is not read: the adapters alone are exported. Everything goes into a
temporary sibling folder, fsynced, then renamed into place; an existing destination is refused
before anything is written, and nothing is left behind on failure.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, cast

import numpy as np

from star_engine import UserError
from star_engine.helpers import fsync_dir, temporary_sibling

from ..checkpoint.format import MANIFEST, checked_manifest, read_leaf, read_manifest
from ..checkpoint.safeio import make_parents, np_dtype, remove_created
from ..model.config import architecture, config_from_dict
from ..model.lora import TARGETS, LoraSpec, module_paths
from . import hf_llama
from .hf_export import rename_noreplace
from .hf_import import hf_name as gptj_hf_name

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's name of the wrapped model inside PeftModelForCausalLM
_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16"}
_HF_NAME = {"gptj": gptj_hf_name, "llama": hf_llama.hf_name}


def hf_module(arch: str, module: str) -> str:
    """The Hugging Face module path of native module ``module`` (``h_3/attn/q`` ->
    ``transformer.h.3.attn.q_proj``), as the merged export names its weight."""
    name, transposed = _HF_NAME[arch]((module, "w"))
    if not (transposed and name.endswith(".weight")):  # only projections are LoRA targets
        raise UserError(f"{module}: not a projection with a Hugging Face Linear weight ({name})")
    return name[: -len(".weight")]


def adapter_config(spec: LoraSpec, target_modules: list[str], base_name: str) -> dict[str, Any]:
    """``adapter_config.json``: the fields peft's ``LoraConfig`` and vLLM's LoRA loader read, each explicit."""
    alpha: int | float = int(spec.alpha) if float(spec.alpha).is_integer() else spec.alpha
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_name,
            "revision": None, "inference_mode": True, "r": spec.rank, "lora_alpha": alpha,
            "use_rslora": spec.rslora, "target_modules": target_modules, "lora_dropout": 0.0,
            "bias": "none", "fan_in_fan_out": False, "use_dora": False, "modules_to_save": None,
            "init_lora_weights": True, "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {}, "alpha_pattern": {}}


def lora_base(checkpoint: str | os.PathLike) -> str | None:
    """The base checkpoint a LoRA checkpoint's adapters are over (its manifest's ``base_path``,
    resolved); None for a whole model's checkpoint."""
    src = Path(checkpoint)
    extra = read_manifest(src)["extra"]
    return str((src / extra["base_path"]).resolve()) if extra.get("kind") == "lora" else None


def _lora_source(src: Path) -> tuple[dict, str, LoraSpec]:
    """The LoRA checkpoint's manifest (checked against its spec), architecture and spec; a one-line
    UserError for anything that is not a LoRA checkpoint."""
    if not (src / MANIFEST).is_file():
        raise UserError(f"{src}: not a checkpoint of this backend (no {MANIFEST})")
    kind = read_manifest(src)["extra"].get("kind")
    if kind != "lora":
        raise UserError(f"{src / MANIFEST}: not a LoRA checkpoint (extra.kind is {kind!r}); a peft adapter is "
                        f"exported from LoRA adapters only (a whole model: --to hf)")
    m = checked_manifest(src)  # the leaves are exactly the spec's adapters, shapes and dtypes
    arch = architecture(config_from_dict(m["model_config"]))
    if arch not in _HF_NAME:
        raise UserError(f"{src / MANIFEST}: architecture {arch!r} has no Hugging Face export "
                        f"(known: {', '.join(_HF_NAME)})")
    return m, arch, LoraSpec.from_dict(m["extra"]["lora"])


def _header(entries: list[tuple[str, tuple[int, ...]]], st_dtype: str, itemsize: int) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in entries:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(raw)) + raw


def _write_file(path: Path, chunks: Any) -> None:
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def export_peft(checkpoint: str | os.PathLike, dest: str | os.PathLike, *, base_name: str,
                dtype: str | None = None) -> dict[str, Any]:
    """Write LoRA checkpoint ``checkpoint``'s adapters as a peft adapter folder at ``dest`` (new).
    ``base_name``: the base model's path or hub name as its users load it (the folder
    ``convert --to hf`` wrote from the base checkpoint, or the name vLLM serves it under),
    recorded as ``base_model_name_or_path``; ``dtype``: the tensors' (default: the adapters'
    own, float32). Returns a summary (files, tensors, bytes, r, alpha, target_modules, dtype)."""
    src, dest = Path(checkpoint), Path(dest)
    if dest.exists() or dest.is_symlink():
        raise UserError(f"{dest}: exists; refusing to overwrite it (nothing written)")
    if not isinstance(base_name, str) or not base_name.strip():
        raise UserError("--base-name: required (the base model's Hugging Face folder or hub name)")
    m, arch, spec = _lora_source(src)
    config = config_from_dict(m["model_config"])
    leaves = {tuple(leaf["path"]): leaf for leaf in m["leaves"]}
    dtype = dtype or leaves[next(iter(leaves))]["dtype"]
    if dtype not in _ST_DTYPE:
        raise UserError(f"--dtype: {dtype!r} cannot be exported (one of {', '.join(_ST_DTYPE)})")
    target = np_dtype(dtype).newbyteorder("<")
    # (peft tensor name, native leaf, shape as written): A^T (r, in), B^T (out, r), layer by layer
    plan: list[tuple[str, Any, tuple[int, ...]]] = []
    for module in module_paths(config, spec):
        hf = PREFIX + hf_module(arch, module)
        for part, name in (("lora_a", "lora_A"), ("lora_b", "lora_B")):
            leaf = leaves[(module, part)]
            plan.append((f"{hf}.{name}.weight", leaf, tuple(reversed(leaf["shape"]))))
    plan.sort(key=lambda p: p[0])
    names = {t: hf_module(arch, f"h_0/{TARGETS[arch][t]}").rsplit(".", 1)[-1] for t in spec.targets}
    target_modules = [names[t] for t in spec.targets]
    config_json = adapter_config(spec, target_modules, base_name)

    def tensors():
        yield _header([(name, shape) for name, _, shape in plan], _ST_DTYPE[dtype], target.itemsize)
        for _, leaf, _shape in plan:
            value = np.ascontiguousarray(read_leaf(src, leaf).T)  # verified against its sha256
            yield memoryview(cast(Any, value.astype(target, copy=False).reshape(-1).view(np.uint8)))

    created = make_parents(dest)  # taken away again if the export fails
    tmp = temporary_sibling(dest)
    tmp.mkdir()
    try:
        _write_file(tmp / WEIGHTS_FILE, tensors())
        _write_file(tmp / CONFIG_FILE, [(json.dumps(config_json, indent=2, ensure_ascii=False) + "\n").encode()])
        fsync_dir(tmp)
        rename_noreplace(tmp, dest)
        fsync_dir(dest.parent)  # the rename itself survives a power cut
        created = []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_created(created)
    data = sum(int(np.prod(shape, dtype=np.int64)) for _, _, shape in plan) * target.itemsize
    return {"files": [CONFIG_FILE, WEIGHTS_FILE], "tensors": len(plan), "bytes": data, "r": spec.rank,
            "alpha": spec.alpha, "rslora": spec.rslora, "scale": spec.scale, "target_modules": target_modules,
            "dtype": dtype, "base_model_name_or_path": base_name}
