"""What this backend checks before a run writes anything (``HaikuXmapBackend.validate_run``,
the optional ``Backend.validate_run`` of ``star_engine.api``, which ``star-engine validate``
and ``star-engine run`` both call): what depends on the model, and nothing the core already
guarantees of ``GenSpec`` / ``TrainSpec`` (``star_engine.config.settings`` declares their ranges).
That is the room a generation leaves for a prompt in the model's context, a training
adapter table against the architecture (targets, rank against the matrices:
``lora.check_table``), and the configured checkpoint's files (manifest, part files and
sizes, the largest leaf against the memory available), without reading any weights; each
refusal names the TOML key that holds the value.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from collections.abc import Mapping

import jax

from star_engine import GenSpec, IntegrityError, TrainSpec, UserError

from .checkpoint.format import MANIFEST, checked_manifest
from .options import check_generation
from .model.lora import check_table
from .model.network import param_shapes
from .runtime.envvars import BARRIER_TIMEOUT, PEER_TIMEOUT, attention_choice, env_seconds
from .checkpoint.safeio import MAX_BUFFER, check_alloc, memory_available, np_dtype


def validate_run(config: Any, checkpoint_path: str, processes: int, generation: Mapping[str, GenSpec],
                 training: Mapping[str, TrainSpec]) -> None:
    """The backend's checks of a run before it starts (see the module docstring), the
    environment variables it reads among them: for the model ``config``, its checkpoint
    ``checkpoint_path`` ("": a random init, held by ``processes`` processes)."""
    for name, default in (BARRIER_TIMEOUT, PEER_TIMEOUT):
        env_seconds(name, default)
    attention_choice()
    for key, spec in generation.items():
        check_generation(key, spec.max_new_tokens, config.n_ctx)
    for key, tspec in training.items():
        if tspec.adapter is not None:
            check_table(tspec.adapter, config, f"{key}.adapter")
    if checkpoint_path:
        check_checkpoint(checkpoint_path)
    else:
        check_model_memory(config, processes)


def check_model_memory(config: Any, processes: int = 1) -> None:
    """A model built from its config (no checkpoint whose leaves ``check_checkpoint`` checks)
    fits in this process's memory once, in its dtype (its share when ``processes`` split it),
    and no leaf exceeds ``MAX_BUFFER``: counted from abstract shapes, before anything is
    allocated and without starting jax's backends; UserError naming [model] otherwise."""
    sizes = [math.prod(x.shape) for x in jax.tree.leaves(param_shapes(config))]
    itemsize = np_dtype(config.dtype).itemsize
    what = (f"model: the model of {sum(sizes):,} parameters (n_layer {config.n_layer}, d_model {config.d_model}, "
            f"vocab {config.vocab})")
    if max(sizes, default=0) * itemsize > MAX_BUFFER:
        raise UserError(f"{what} has a weight of {max(sizes) * itemsize:,} bytes, more than the limit of "
                        f"{MAX_BUFFER:,} for one buffer", key="model")
    need, available = sum(sizes) * itemsize // max(1, processes), memory_available()
    if available is not None and need > available:
        raise UserError(f"{what} needs {need / 2**30:.1f} GiB in {config.dtype}, more than the "
                        f"{available / 2**30:.1f} GiB of memory this process can allocate; choose a smaller model",
                        key="model")


def check_checkpoint(path: str | os.PathLike) -> dict:
    """Everything about checkpoint ``path`` that can be checked without reading its parts: the
    manifest (schema, against the model config) and every part file's presence and size, and
    that the largest leaf could be allocated. Returns the manifest; IntegrityError naming the file."""
    root = Path(path)
    m = checked_manifest(root)
    for leaf in m["leaves"]:
        for part in leaf["parts"] if "parts" in leaf else [leaf]:
            f = root / part["file"]
            try:
                size = f.stat().st_size if f.is_file() else None
            except OSError:
                size = None
            if size is None:
                raise IntegrityError(f"{f}: part file missing")
            if size != part["compressed_bytes"]:
                raise IntegrityError(f"{f}: {size} bytes on disk, manifest says {part['compressed_bytes']} "
                                     f"(truncated or replaced)")
    largest = max(m["leaves"], key=lambda e: math.prod(e["shape"]) * np_dtype(e["dtype"]).itemsize, default=None)
    if largest is not None:
        check_alloc(math.prod(largest["shape"]) * np_dtype(largest["dtype"]).itemsize,
                    f"{root / MANIFEST}: leaf {'/'.join(largest['path'])}")
    return m
