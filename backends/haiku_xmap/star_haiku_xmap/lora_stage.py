"""A LoRA fine-tuning stage of the backend (``HaikuXmapBackend.train`` with an ``adapter``
table) and reading LoRA checkpoints back.

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

from . import lora


def load_adapters(backend: Any, checkpoint: str, manifest: dict) -> tuple[str, lora.LoraSpec, Any]:
    """(its base checkpoint, its spec, its adapters on the backend's mesh) of the LoRA
    checkpoint ``checkpoint`` (``manifest`` read), after checking its model and base."""
    import jax

    from . import sharding
    from .config import config_from_dict
    from .checkpoint.format import load_checkpoint

    extra = manifest["extra"]
    stored = config_from_dict(manifest["model_config"])
    if stored.replace(dtype=backend.config.dtype) != backend.config:
        raise UserError(f"{checkpoint}: its model config {stored.to_dict()} is not this backend's "
                        f"{backend.config.to_dict()}")
    base = str((Path(checkpoint) / extra["base_path"]).resolve())
    have = backend.checkpoint_id(base) if Path(base, "manifest.msgpack").is_file() else None
    if have != extra["base"]:
        raise UserError(f"{checkpoint}: its adapters were trained over base checkpoint {extra['base'][:16]}..., "
                        f"but {base} " + ("holds no checkpoint" if have is None else f"is {have[:16]}...")
                        + "; adapters load only over their own base")
    spec = lora.LoraSpec.from_dict(extra["lora"])
    shapes = jax.eval_shape(lambda k: lora.init_adapters(backend.config, spec, k), jax.random.key(0))
    adapters, _ = load_checkpoint(checkpoint, shardings=sharding.tree_shardings(shapes, backend.mesh))
    return base, spec, adapters


def load_merged(backend: Any, checkpoint: str, manifest: dict, dtype: str) -> Any:
    """The LoRA checkpoint ``checkpoint`` as a plain model on the backend's mesh: its base
    (loaded in ``dtype``) with W + s A B merged in (``lora.merge``)."""
    base, spec, adapters = load_adapters(backend, checkpoint, manifest)
    return lora.merge(backend.load_params(base, dtype, keep=False), adapters, spec, dtype)


def train_adapters(backend: Any, init: str, out: Path, encoded: Sequence[Any], spec: TrainSpec,
                   progress: Progress | None) -> TrainResult:
    """The LoRA stage writing ``out`` from ``init`` (see the module docstring)."""
    from . import packing as pk
    from . import train as tr
    from .checkpoint.format import read_manifest
    from .resume import stage_snapshots

    want = lora.check_table(spec.adapter, backend.config, "training.adapter")
    manifest = read_manifest(init)
    if manifest["extra"].get("kind") == "lora":
        base, have, adapters = load_adapters(backend, init, manifest)
        if have != want:
            raise UserError(f"training.adapter: {want.to_dict()} differs from the adapters it continues "
                            f"({init}: {have.to_dict()}); use the same table, or restart_from_base = true",
                            key="training.adapter")
    else:
        base, adapters = init, None
    snapshots = stage_snapshots(backend, init, out, spec, encoded)
    frozen = backend.load_params(base)  # the compute dtype: no copy when the base is stored in it
    try:
        trained, losses, tokens = tr.train(frozen, backend.config, encoded, backend.train_config(spec, want),
                                           mesh=backend.mesh, progress=progress, snapshots=snapshots,
                                           adapters=adapters)
    except pk.PackingError as exc:
        raise UserError(f"training.packing: {exc}", key="training.packing") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    ckpt_id = backend.keep_written(
        out, trained, {"kind": "lora", "lora": want.to_dict(), "base": backend.checkpoint_id(base),
                       "base_path": os.path.relpath(Path(base).resolve(), out.resolve()),
                       "init": backend.checkpoint_id(init), "steps": spec.steps, "seed": spec.seed,
                       "examples": len(encoded), "packing": spec.packing, "loss": spec.loss,
                       "compute_dtype": backend.config.dtype},
        specs=lora.adapter_specs(backend.config, want), compute=lora.merge(frozen, trained, want, backend.config.dtype))
    return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                       losses=tuple(losses))
