"""The backend's jax-using bodies: ``plugin.HaikuXmapBackend`` (the façade the core builds,
jax-free) imports this module once, when it first needs the runtime, and hands each call on.

``Engine`` holds the started runtime (``machine.start_runtime``: devices, multi-process JAX,
the mesh) and the weights on it (``weights.Weights``); building one starts nothing (the
checks of ``validate_run`` need jax, not the runtime). Fine-tuning writes the master weights
(``extra.compute_dtype``); the LoRA and preference stages are ``train/``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

import jax

from star_engine import (GenRequest, GenSpec, PreferencePair, PreferenceSpec, Progress, TrainExample, TrainResult,
                         TrainSpec, UserError)

from . import preflight
from .checkpoint.format import read_manifest
from .model import network
from .options import BACKEND, Model, ModelOptions, decode_config, train_config
from .sampling.static import keys_from_seeds
from .sampling.text import generate_text
from .train import chunked_ce, fused_ce, lora_stage, preference, resume
from .train import packing as pk
from .train import trainer as tr
from .runtime import coordination, sharding
from .session.machine import Runtime, start_runtime
from .session.weights import Weights

BASE_DIR = "base_init"


class Engine:
    """The runtime of a backend of ``options`` (``model``: what they make, ``options.resolve``),
    started on first use, and the weights on its mesh."""

    def __init__(self, options: ModelOptions, model: Model, process_layout: dict | None) -> None:
        self.options, self.model, self.process_layout = options, model, process_layout
        self.config, self.tokenizer, self.seq_len = model
        self._runtime: Runtime | None = None
        self._weights: Weights | None = None

    @property
    def started(self) -> bool:
        return self._runtime is not None

    def runtime(self) -> Runtime:
        """The started runtime, starting it if need be."""
        if self._runtime is None:
            self._runtime = start_runtime(self.options)
        return self._runtime

    @property
    def mesh(self) -> Any:
        return self.runtime().mesh

    @property
    def train_mesh(self) -> Any:
        """The mesh fine-tuning runs on (``[model] train_mesh``; else ``mesh``)."""
        return self.runtime().train_mesh

    @property
    def weights(self) -> Weights:
        """The weights on the mesh (the runtime started)."""
        if self._weights is None:
            self._weights = Weights(self.model, self.mesh)
        return self._weights

    # ------------------------------------------------------------------ checkpoints

    def base(self, workdir: Path, seed: int) -> str:
        """The configured checkpoint, else a random init of ``seed`` written once under ``workdir``."""
        if self.options.checkpoint_path:
            return self.options.checkpoint_path
        out = Path(workdir) / BASE_DIR
        extra = {"kind": "random_init", "seed": int(seed)}
        self.barrier(f"base {out}")  # several processes decide on the same files
        if (out / "manifest.msgpack").is_file():
            m = read_manifest(out)
            if m["model_config"] == self.config.to_dict() and m["extra"] == extra:
                return str(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        params = network.init_params(self.config, keys_from_seeds([seed])[0])
        self.weights.save(out, params, extra)
        return str(out)

    # ------------------------------------------------------------------ train

    def train(self, init: str, out: Path, examples: Sequence[TrainExample], spec: TrainSpec,
              progress: Progress | None = None) -> TrainResult:
        """``HaikuXmapBackend.train``: the checkpoint stores the master weights (as its model
        dtype; ``extra.compute_dtype``)."""
        limit = None if spec.packing == "stream" else self.seq_len  # a stream example may span chunks
        encoded = []
        for i, ex in enumerate(examples):
            try:
                encoded.append(tr.encode_example(self.tokenizer, ex.prompt, ex.completion, limit))
            except ValueError as exc:
                raise UserError(f"training example {i}: {exc}") from None
        if spec.steps > 0 and not encoded:
            raise UserError(f"training: {spec.steps} steps requested but there are no training examples",
                            key="training")
        weights, o = self.weights, self.options
        if spec.adapter is not None:
            return lora_stage.train_adapters(weights, o, init, Path(out), encoded, spec, progress)
        snapshots = resume.stage_snapshots(weights, o, init, out, spec, encoded)
        try:
            # No local reference to the loaded weights: the trainer's master copy replaces them.
            params, losses, tokens = tr.train(weights.load(init, o.master_dtype, keep=False), self.config, encoded,
                                              train_config(o, self.model, spec), mesh=self.train_mesh,
                                              progress=progress, snapshots=snapshots)
        except pk.PackingError as exc:
            raise UserError(f"training.packing: {exc}", key="training.packing") from None
        if self.train_mesh is not self.mesh:  # back onto the run's mesh, for what follows
            params = jax.device_put(params, sharding.tree_shardings(params, self.mesh))
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        stored = str(jax.tree.leaves(params)[0].dtype)
        ckpt_id = weights.keep_written(out, params, {"kind": "finetune", "init": weights.checkpoint_id(init),
                                                     "steps": spec.steps, "seed": spec.seed, "examples": len(encoded),
                                                     "packing": spec.packing, "loss": spec.loss,
                                                     "compute_dtype": self.config.dtype}, dtype=stored)
        return TrainResult(checkpoint=str(out), checkpoint_id=ckpt_id, steps=spec.steps, tokens=tokens,
                           losses=tuple(losses))

    def train_preferences(self, init: str, out: Path, pairs: Sequence[PreferencePair], spec: PreferenceSpec,
                          progress: Progress | None = None) -> TrainResult:
        return preference.train_preferences(self.weights, self.options, init, Path(out), pairs, spec, progress)

    def score(self, checkpoint: str, examples: Sequence[TrainExample], batch_size: int,
              progress: Progress | None = None) -> list[float]:
        return preference.score(self.weights, checkpoint, examples, batch_size, progress)

    def checkpoint_recorded(self, checkpoint: str) -> None:
        self.runtime()
        resume.release(checkpoint)

    # ------------------------------------------------------------------ generate

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        """``HaikuXmapBackend.generate`` of at least one request and one new token (``spec``'s
        ``max_new_tokens`` checked against the model once, by ``validate_run``)."""
        return generate_text(self.weights.load(checkpoint), requests, spec, tokenizer=self.tokenizer,
                             config=self.config, mesh=self.mesh, decode=decode_config(self.options, self.tokenizer, spec),
                             continuous=self.options.generation == "continuous", progress=progress)

    # ------------------------------------------------------------------ processes

    def layout(self) -> tuple[int, int]:
        """(this process's index, the number of processes), the runtime started."""
        self.runtime()
        return jax.process_index(), jax.process_count()

    def barrier(self, name: str) -> None:
        self.runtime()
        coordination.barrier(name)

    def abort(self, message: str) -> None:
        if self.started:
            coordination.abort(message)

    def validate_run(self, generation: Mapping[str, GenSpec], training: Mapping[str, TrainSpec]) -> None:
        processes = (self.process_layout or {}).get("num_processes") or 1
        preflight.validate_run(self.config, self.options.checkpoint_path, processes, generation, training)
        if self.options.decode_attention == "ragged":  # its kernel built now (once; its errors before the run)
            from .kernels.ragged import library

            library()

    def describe(self) -> Mapping[str, Any]:
        o, mesh = self.options, self.mesh
        return {"backend": BACKEND, "model": self.config.to_dict(), "param_count": network.param_count(self.config),
                "tokenizer": {k: v for k, v in self.tokenizer.to_dict().items() if k != "json"},
                "checkpoint_path": o.checkpoint_path, "seq_len": self.seq_len,
                "mesh": {"dp": int(mesh.shape["dp"]), "mp": int(mesh.shape["mp"])},
                "train_mesh": {"dp": int(self.train_mesh.shape["dp"]), "mp": int(self.train_mesh.shape["mp"])},
                "zero": o.zero, "opt_state_dtype": o.opt_state_dtype, "master_dtype": o.master_dtype,
                "grad_accum_dtype": o.grad_accum_dtype, "remat": o.remat,
                "loss_chunk": chunked_ce.chunk_for(o.loss_chunk),
                "loss_tokens": fused_ce.tokens_for(o.loss_tokens, self.config.vocab),
                "loss_dot_dtype": o.loss_dot_dtype, "generation": o.generation,
                "decode_attention": o.decode_attention,
                "train_checkpoint_steps": o.train_checkpoint_steps,
                "train_checkpoint_minutes": o.train_checkpoint_minutes,
                "processes": self.layout()[1],
                "devices": [str(d) for d in mesh.devices.flat]}
