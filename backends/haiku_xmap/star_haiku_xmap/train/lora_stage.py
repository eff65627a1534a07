"""A LoRA fine-tuning stage of the backend (``HaikuXmapBackend.train`` with an ``adapter``
table); LoRA checkpoints are read back by the weights (``runtime/weights.py``).

A LoRA stage trains adapters over a frozen base and writes a checkpoint of the adapters
alone (``extra.kind = "lora"``): their spec, the base checkpoint's id (``extra.base``, the
sha256 of its manifest) and where it lies relative to the adapters (``extra.base_path``).
Loading one checks the base it finds there against that id, and refuses any other base.
A stage whose ``init`` is itself a LoRA checkpoint (``restart_from_base = false``)
continues its adapters over the same base; any other ``init`` (the base model, or a fully
fine-tuned one) is the frozen base of fresh adapters (the identity).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from star_engine import Progress, TrainResult, TrainSpec, UserError

from ..checkpoint.format import read_manifest
from ..model import lora
from ..options import ModelOptions, train_config
from ..session.weights import Weights
from . import packing as pk
from . import trainer as tr
from .resume import stage_snapshots


def train_adapters(weights: Weights, options: ModelOptions, init: str, out: Path, encoded: Sequence[Any],
                   spec: TrainSpec, progress: Progress | None) -> TrainResult:
    """The LoRA stage writing ``out`` from ``init`` (see the module docstring) with the
    backend's ``weights`` and ``[model]`` ``options``."""
    config = weights.config
    want = lora.check_table(spec.adapter, config, "training.adapter")
    manifest = read_manifest(init)
    if manifest["extra"].get("kind") == "lora":
        base, have, adapters = weights.load_adapters(init, manifest)
        if have != want:
            raise UserError(f"training.adapter: {want.to_dict()} differs from the adapters it continues "
                            f"({init}: {have.to_dict()}); use the same table, or restart_from_base = true",
                            key="training.adapter")
    else:
        base, adapters = init, None
    snapshots = stage_snapshots(weights, options, init, out, spec, encoded)
    frozen = weights.load(base)  # the compute dtype: no copy when the base is stored in it
    try:
        trained, losses, tokens = tr.train(frozen, config, encoded, train_config(options, weights.model, spec, want),
                                           mesh=weights.mesh, progress=progress, snapshots=snapshots,
                                           adapters=adapters)
    except pk.PackingError as exc:
        raise UserError(f"training.packing: {exc}", key="training.packing") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    ckpt_id = weights.keep_written(
        out, trained, {"kind": "lora", "lora": want.to_dict(), "base": weights.checkpoint_id(base),
                       "base_path": os.path.relpath(Path(base).resolve(), out.resolve()),
                       "init": weights.checkpoint_id(init), "steps": spec.steps, "seed": spec.seed,
                       "examples": len(encoded), "packing": spec.packing, "loss": spec.loss,
                       "compute_dtype": config.dtype},
        specs=lora.adapter_specs(config, want), compute=lora.merge(frozen, trained, want, config.dtype))
    return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                       losses=tuple(losses))
