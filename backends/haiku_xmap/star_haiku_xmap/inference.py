"""Two user-level helpers: load a model, get its logits.

>>> config, params, tokenizer = load_model("runs/x/iter_3/model")      # native checkpoint
>>> config, params, tokenizer = load_model("~/gpt-j-6b-safetensors")    # HF GPT-J folder
>>> logits("runs/x/iter_3/model", tokenizer.encode("Q: 2+2?\\nA:")).shape   # (T, V) fp32
>>> logits((config, params, tokenizer), [[1, 2, 3], [4, 5, 6]]).shape    # (B, T, V)
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import jax
import numpy as np

from star_engine import UserError

from .checkpoint.format import MANIFEST, load_checkpoint
from .model.config import ModelConfig, config_from_dict
from .convert.hf_import import folder_tokenizer, import_hf
from .model.network import forward
from .tokenizer import tokenizer_from_dict

Loaded = tuple[ModelConfig, dict, Any]


def load_model(checkpoint_dir: str | os.PathLike, *, dtype: str = "float32", shardings: Any = None) -> Loaded:
    """(config, params, tokenizer) from a native checkpoint (a folder with
    ``manifest.msgpack``, fully verified) or an HF safetensors folder (GPT-J, Llama, Qwen2, Mistral)
    (converted to ``dtype``; its tokenizer is the folder's ``tokenizer.json``,
    or None when it has none). ``shardings`` applies to native checkpoints."""
    path = Path(checkpoint_dir).expanduser()
    if (path / MANIFEST).is_file():
        params, manifest = load_checkpoint(path, shardings)
        return config_from_dict(manifest["model_config"]), params, tokenizer_from_dict(manifest["tokenizer"])
    if (path / "config.json").is_file() or path.is_file():
        config, params = import_hf(path, dtype=dtype)
        folder = path if path.is_dir() else path.parent
        tok = folder_tokenizer(folder) if (folder / "tokenizer.json").is_file() else None
        return config, params, tok
    raise UserError(f"{path}: neither a checkpoint (manifest.msgpack) nor an HF folder (config.json)")


@functools.lru_cache(maxsize=8)
def _jitted_forward(config: ModelConfig):
    return jax.jit(lambda params, tokens: forward(params, tokens, config))


def logits(model: str | os.PathLike | Loaded, token_ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray
           ) -> np.ndarray:
    """fp32 next-token logits: (T, V) for one sequence, (B, T, V) for a batch of
    equal-length sequences. ``model`` is a path for ``load_model`` or its result."""
    config, params, _ = load_model(model) if isinstance(model, (str, os.PathLike)) else model
    try:
        ids = np.asarray(token_ids, dtype=np.int64)
    except (TypeError, ValueError) as exc:  # ragged or non-integer input
        raise UserError(f"token_ids must be integers in equal-length rows ({exc})") from None
    if ids.ndim not in (1, 2) or ids.shape[-1] == 0:
        raise UserError(f"token_ids must be a non-empty 1-D or 2-D array of ids, got shape {ids.shape}")
    if ids.shape[-1] > config.n_ctx:
        raise UserError(f"{ids.shape[-1]} tokens exceed the model's context of {config.n_ctx}")
    if ids.min() < 0 or ids.max() >= config.vocab:
        raise UserError(f"token ids must lie in [0, {config.vocab}), got [{ids.min()}, {ids.max()}]")
    batch = ids if ids.ndim == 2 else ids[None]
    out = np.asarray(_jitted_forward(config)(params, batch.astype(np.int32)), dtype=np.float32)
    return out if ids.ndim == 2 else out[0]
