"""What this backend checks before a run writes anything (``HaikuXmapBackend.validate_run``,
the optional ``Backend.validate_run`` of ``star_engine.api``): the generation and training
specs the run will use against the model (context length, room for a prompt, sampling
values), and the configured checkpoint's files (manifest, part files and
sizes, the largest leaf against the memory available), without reading any weights.

Everything ``generate`` and ``train`` would refuse later for these specs is refused here,
with the TOML key that holds the value, so that ``star-engine validate`` reports it and
``star-engine run`` refuses before its run directory exists.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from star_engine.api import GenSpec, TrainSpec
from star_engine.errors import IntegrityError, UserError
from star_engine.options import is_int

from .checkpoint.format import MANIFEST, checked_manifest
from .checkpoint.safeio import check_alloc, np_dtype


def _int(value: Any, minimum: int) -> bool:
    return is_int(value) and value >= minimum


def check_generation(key: str, spec: GenSpec, n_ctx: int) -> None:
    """``spec`` (from TOML section ``key``) against a model of context ``n_ctx``."""
    n = spec.max_new_tokens
    if not _int(n, 0):
        raise UserError(f"{key}.max_new_tokens: must be an int >= 0, got {n!r}")
    if n >= n_ctx:
        raise UserError(f"{key}.max_new_tokens: {n} leaves no room for a prompt in the model's context of "
                        f"n_ctx = {n_ctx} tokens (model.n_ctx); use at most {n_ctx - 1}")
    if not (isinstance(spec.temperature, (int, float)) and math.isfinite(spec.temperature) and spec.temperature >= 0):
        raise UserError(f"{key}.temperature: must be a finite number >= 0, got {spec.temperature!r}")
    if not (isinstance(spec.top_p, (int, float)) and 0 < spec.top_p <= 1):
        raise UserError(f"{key}.top_p: must be in (0, 1], got {spec.top_p!r}")
    if not _int(spec.batch_size, 1):
        raise UserError(f"{key}.batch_size: must be an int >= 1, got {spec.batch_size!r}")


def check_training(key: str, spec: TrainSpec) -> None:
    """``spec`` (from TOML section ``key``): its sizes (its optimizer table was checked and
    completed by ``options.AdamW`` when the experiment was loaded)."""
    for name, minimum in (("steps", 0), ("batch_size", 1), ("grad_accum", 1)):
        value = getattr(spec, name)
        if not _int(value, minimum):
            raise UserError(f"{key}.{name}: must be an int >= {minimum}, got {value!r}")


def validate_run(backend: Any, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None:
    """The backend's checks of a run before it starts (see the module docstring)."""
    for key, spec in generation.items():
        check_generation(key, spec, backend.config.n_ctx)
    for key, spec in training.items():
        check_training(key, spec)
        if spec.adapter is not None:
            from .lora import check_table

            check_table(spec.adapter, backend.config, f"{key}.adapter")
    if backend._checkpoint_path:
        check_checkpoint(backend._checkpoint_path)


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
