"""The weights on the devices: a model's parameters loaded from checkpoints onto the mesh
(the last one kept, ``load``), written (``save``), and a stage's checkpoint written and kept
for what follows it (``keep_written``). The one thing the backend, the LoRA stage
(``train/lora_stage.py``) and the preference stage (``train/preference.py``) share.

Checkpoints are native checkpoint directories (``checkpoint/format.py``); a checkpoint's id
is the sha256 of its manifest. A LoRA checkpoint (``extra.kind = "lora"``) holds adapters
alone: ``load_adapters`` reads them back after checking the base they name (its id and where
it lies, ``extra.base`` / ``extra.base_path``), and ``load`` gives them merged into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from star_engine import UserError

from ..checkpoint.format import load_checkpoint, manifest_sha256, read_manifest
from ..model import lora, network
from ..model.config import config_from_dict
from ..options import Model
from ..runtime import sharding
from .distributed import save_checkpoint


class Weights:
    """Parameters of ``model`` (``options.Model``: config, tokenizer, training length) on
    ``mesh``; one model is kept on the devices at a time (the last loaded or written)."""

    def __init__(self, model: Model, mesh: Any) -> None:
        self.model = model
        self.config, self.tokenizer, self.seq_len = model
        self.mesh = mesh
        self._cache: tuple[tuple[str, str], str, Any] | None = None  # ((path, checkpoint id), dtype, params)

    @property
    def cached_dtype(self) -> str | None:
        """The dtype of the weights kept on the devices (None: none kept)."""
        return None if self._cache is None else self._cache[1]

    def forget(self) -> None:
        """Drop the weights kept on the devices (the next ``load`` reads its checkpoint)."""
        self._cache = None

    @staticmethod
    def checkpoint_id(checkpoint: str) -> str:
        return manifest_sha256(checkpoint)

    def save(self, path: Path, params: Any, extra: dict, dtype: str | None = None, specs: Any = None) -> None:
        """Write ``params``; ``dtype``: the stored dtype when it is not the compute
        dtype (fp32 master weights), recorded as the checkpoint's model dtype; ``specs``:
        the leaves expected when they are not the model's (LoRA adapters)."""
        config = self.config if dtype is None else self.config.replace(dtype=dtype)
        # On an mp > 1 mesh the mp-sharded leaves are stored as mp parts, so that a
        # later load reads only each device's slice (checkpoint/format.py, version 2).
        save_checkpoint(path, params, model_config=config.to_dict(), tokenizer=self.tokenizer.to_dict(),
                        extra=extra, mp_split=int(self.mesh.shape["mp"]), specs=specs)

    def keep_written(self, out: Path, params: Any, extra: dict, *, dtype: str | None = None, specs: Any = None,
                     compute: Any = None) -> str:
        """Write a stage's checkpoint ``out`` of ``params`` (``save``'s arguments) and keep its
        weights on the devices for the generation or scoring that follows, in the compute dtype:
        ``compute`` when the caller has them so (merged LoRA adapters), else ``params`` cast,
        laid out by the rule table (ZeRO-1 returns fp32 masters split over dp). Returns its id."""
        self.save(out, params, extra, dtype=dtype, specs=specs)
        ckpt_id = self.checkpoint_id(str(out))
        if compute is None:
            cast = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(jnp.dtype(self.config.dtype)), p),
                           out_shardings=sharding.tree_shardings(params, self.mesh))
            compute = cast(params)
        self._cache = ((str(out.resolve()), ckpt_id), self.config.dtype, compute)
        return ckpt_id

    def load(self, checkpoint: str, dtype: str | None = None, keep: bool = True) -> Any:
        """Params of ``checkpoint`` on the mesh, cast to ``dtype`` (default: the compute
        dtype). The last one loaded is cached (``keep``) in its dtype; the cache also
        serves another dtype when it holds the stored values (the cast is then exact)."""
        dtype = dtype or self.config.dtype
        key = (str(Path(checkpoint).resolve()), self.checkpoint_id(checkpoint))
        manifest = read_manifest(checkpoint)
        adapters = manifest["extra"].get("kind") == "lora"  # adapters alone, merged into their base
        stored = config_from_dict(manifest["model_config"])
        cache, self._cache = self._cache, (self._cache if keep else None)
        exact = (dtype,) if adapters else (dtype, stored.dtype)  # a merged model is cached in its dtype only
        if cache is not None and cache[0] == key and cache[1] in exact:
            return jax.tree.map(lambda p: p.astype(jnp.dtype(dtype)), cache[2])
        del cache
        self._cache = None  # one model on the devices at a time
        if adapters:
            merged = self.load_merged(checkpoint, manifest, dtype)
            self._cache = (key, dtype, merged) if keep else None
            return merged
        self.check_config(checkpoint, manifest)
        shapes = network.param_shapes(stored)
        params, _ = load_checkpoint(checkpoint, shardings=sharding.tree_shardings(shapes, self.mesh))
        params = jax.tree.map(lambda p: p.astype(jnp.dtype(dtype)), params)
        if keep:
            self._cache = (key, dtype, params)
        return params

    def check_config(self, checkpoint: str, manifest: dict) -> None:
        """UserError unless ``checkpoint``'s model (``manifest`` read) is this one, in any dtype."""
        stored = config_from_dict(manifest["model_config"])
        if stored.replace(dtype=self.config.dtype) != self.config:
            raise UserError(f"{checkpoint}: its model config {stored.to_dict()} is not this backend's "
                            f"{self.config.to_dict()}")

    def load_adapters(self, checkpoint: str, manifest: dict) -> tuple[str, lora.LoraSpec, Any]:
        """(its base checkpoint, its spec, its adapters on the mesh) of the LoRA checkpoint
        ``checkpoint`` (``manifest`` read), after checking its model and base."""
        extra = manifest["extra"]
        self.check_config(checkpoint, manifest)
        base = str((Path(checkpoint) / extra["base_path"]).resolve())
        have = self.checkpoint_id(base) if Path(base, "manifest.msgpack").is_file() else None
        if have != extra["base"]:
            raise UserError(f"{checkpoint}: its adapters were trained over base checkpoint {extra['base'][:16]}..., "
                            f"but {base} " + ("holds no checkpoint" if have is None else f"is {have[:16]}...")
                            + "; adapters load only over their own base")
        spec = lora.LoraSpec.from_dict(extra["lora"])
        shapes = jax.eval_shape(lambda k: lora.init_adapters(self.config, spec, k), jax.random.key(0))
        adapters, _ = load_checkpoint(checkpoint, shardings=sharding.tree_shardings(shapes, self.mesh))
        return base, spec, adapters

    def load_merged(self, checkpoint: str, manifest: dict, dtype: str) -> Any:
        """The LoRA checkpoint ``checkpoint`` as a plain model on the mesh: its base (loaded in
        ``dtype``) with W + s A B merged in (``lora.merge``)."""
        base, spec, adapters = self.load_adapters(checkpoint, manifest)
        return lora.merge(self.load(base, dtype, keep=False), adapters, spec, dtype)
